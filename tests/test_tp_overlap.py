"""TP communication overlapped with its GEMMs (``--tp-overlap``): Transformer Engine's three
methods worked by hand, the pass on a real SDPA Llama at TP 2 with sequence parallelism, and
the refusals."""

from __future__ import annotations

import functools
import math

import pytest
from conftest import MODELS, run_main

from passes.algorithms.tp_overlap import added_s, method_of
from passes.overlap_tensor_parallel import OverlapTensorParallelPass
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import LatencyAttr, LayerLatencyAttr
from phaze_ir.errors import PhazeError


def test_methods_worked_by_hand():
    sms = 132
    # ring exchange at TP 4: 4 GEMM chunks of 1 s, 3 hops of 1 s on 1 SM: each hop ends at
    # max(1, 1 + 1/132), so 1 + 3 x (1 + 1/132) = 4 + 3/132 s against the GEMM's 4.
    assert math.isclose(added_s("ring_exchange", 3.0, 4.0, 4, sms), 3 / 132)
    # pipeline: 4 chunks of 1 s, each chunk's reduce-scatter (0.5 s, 16 SMs) beside the next,
    # the last alone; TE launches every chunk on 132 - 16 SMs (set_sm_margin), so a chunk takes
    # 132/116 s whether a hop runs beside it or not: 4 x 132/116 + 0.5 - 4.
    assert math.isclose(added_s("pipeline", 2.0, 4.0, 4, sms), 4 * 132 / 116 + 0.5 - 4)
    # Without the margin (torch's micro-pipelined TP) a chunk shares its SMs only while a hop
    # runs: 1 + 3 x (1 + 16/132 x 0.5) + 0.5 - 4.
    assert math.isclose(added_s("pipeline", 2.0, 4.0, 4, sms, False), 1 + 3 * (1 + 16 / 132 * 0.5) + 0.5 - 4)
    # bulk: the whole 2 s beside the whole 4 s GEMM, the GEMM on 116 SMs: 4 x 132/116 - 4;
    # without the margin, 16/132 of the collective's 2 s.
    assert math.isclose(added_s("bulk", 2.0, 4.0, 4, sms), 4 * 132 / 116 - 4)
    assert math.isclose(added_s("bulk", 2.0, 4.0, 4, sms, False), 16 / 132 * 2)
    # The margin costs the GEMM its SMs' share however short the collective beside it.
    assert added_s("bulk", 1e-9, 4.0, 4, sms) == pytest.approx(4 * 16 / 116)
    assert added_s("ring_exchange", 3.0, 4.0, 4, sms, False) == added_s("ring_exchange", 3.0, 4.0, 4, sms)
    # Longer than its GEMM, a collective shows what the GEMM cannot hide.
    assert added_s("bulk", 6.0, 4.0, 4, sms) == pytest.approx(2.0)
    assert added_s("ring_exchange", 3.0, 0.0, 4, sms) == 3.0  # no GEMM beside it
    assert method_of("all_gather", "fwd", True) == "ring_exchange"
    assert method_of("reduce_scatter", "fwd", True) == "pipeline"
    assert method_of("all_gather", "bwd", True) == "ring_exchange"  # the output gradient's
    assert method_of("all_gather", "bwd", False) == "bulk"  # the saved input's, for the wgrad
    assert method_of("reduce_scatter", "bwd", True) == "bulk"


@functools.cache
def _latency_text(sp: bool, stage: str = "latency") -> str:
    from phaze.tools.phazec import _parser, compile_model

    args = _parser().parse_args(
        [str(MODELS / "tiny_llama_sdpa.py"), "--hw", "h100", "--emit", stage, "--kernels", "eager", "--tp", "2"]
        + ["--micro-batch", "1", "--sequence-parallel", "on" if sp else "off", "-q", "--no-cache"]
        + ["--dtype", "float16"]  # 16-bit throughout, the default before a GPU's became bf16 autocast
    )
    text, failure = compile_model(args, lambda msg: None)
    assert failure is None, failure
    return text


def _lat(o) -> float:
    return float(keys.require(o, keys.LATENCY, LatencyAttr).as_dict()["split_s"])


def test_the_pass_hides_sequence_parallel_collectives_behind_their_gemms():
    from xdsl.context import Context

    from passes.estimate_latency import EstimateLatencyPass
    from phaze_ir.ir import parse_module

    before, after = parse_module(_latency_text(True)), parse_module(_latency_text(True, "tiled"))
    OverlapTensorParallelPass().apply(Context(), after)  # says how the collectives run
    assert keys.TP_OVERLAP in after.attributes
    EstimateLatencyPass().apply(Context(), after)  # prices them so
    pairs = list(zip(before.walk(), after.walk()))
    overlapped = [(a, b) for a, b in pairs if isinstance(b, ph.CollectiveOp) and b.kind.data != "all_reduce"]
    assert len(overlapped) >= 8
    for a, b in overlapped:
        assert 0.0 <= _lat(b) <= _lat(a)
    assert sum(_lat(b) for _, b in overlapped) < 0.5 * sum(_lat(a) for a, _ in overlapped)
    for a, b in pairs:  # the rest as priced
        if keys.LATENCY in a.attributes and not (isinstance(b, ph.CollectiveOp) and b.kind.data != "all_reduce"):
            assert _lat(a) == _lat(b)
    totals = [r.as_dict() for r in keys.records_of(after, keys.LAYER_LATENCY, LayerLatencyAttr)]
    sums: dict[tuple[int, str], float] = {}
    for o in after.walk():
        if keys.LATENCY in o.attributes and keys.LAYER in o.attributes:
            k = (o.attributes[keys.LAYER].value.data, keys.string_of(o, keys.PHASE, "fwd"))
            sums[k] = sums.get(k, 0.0) + _lat(o)
    for t in totals:
        assert math.isclose(float(t["fwd_s"]), sums.get((int(t["index"]), "fwd"), 0.0), rel_tol=1e-12)
    with pytest.raises(PhazeError, match="priced with TP overlap already"):
        OverlapTensorParallelPass().apply(Context(), after)
    # Priced again, the overlap stays: the pricing's own, not a later pass's rescaling.
    text = str(after)
    EstimateLatencyPass().apply(Context(), after)
    assert str(after) == text
    # Marked after the pricing, the overlap would be said and not priced: refused.
    with pytest.raises(PhazeError, match="priced already .* run it before phaze-estimate-latency"):
        OverlapTensorParallelPass().apply(Context(), parse_module(_latency_text(True)))


def test_the_sm_margin_costs_what_its_share_of_the_sms_does():
    """TE's SM margin (pipeline, bulk): a GEMM confined to sms - 16 SMs; the cost grows with the
    GEMM's time and the communication's share of the SMs, never below the contention rule's,
    and is g x 16/(sms - 16) while the collective hides behind the confined GEMM."""
    for method in ("pipeline", "bulk"):
        costs = [added_s(method, 0.1, g, 8, 132) for g in (1.0, 2.0, 4.0, 8.0)]
        assert costs == sorted(costs) and costs[0] > 0
        assert added_s(method, 0.1, 4.0, 8, 132) > added_s(method, 0.1, 4.0, 8, 264)  # more SMs, less share
        for c, g in ((0.1, 4.0), (2.0, 4.0), (6.0, 4.0), (3.0, 0.5)):
            assert added_s(method, c, g, 8, 132) >= added_s(method, c, g, 8, 132, False) - 1e-15
    assert added_s("bulk", 0.1, 4.0, 8, 132) == pytest.approx(4.0 * 16 / 116)
    # pipeline: the last hop (0.1 / 4) after the 4 confined chunks
    assert added_s("pipeline", 0.1, 4.0, 8, 132) == pytest.approx(4.0 * 16 / 116 + 0.1 / 4)


def test_overlap_worked_by_hand():
    """The latencies of tests/filecheck/overlap_tensor_parallel.mlir (worked by hand there): what
    each overlapped collective adds to its GEMMs, as phaze-estimate-latency writes it."""
    from pathlib import Path

    from passes.how_ops_run import overlap_latencies
    from phaze_ir.hardware_ir import module_accelerator
    from phaze_ir.ir import parse_module

    text = (Path(__file__).parent / "filecheck" / "overlap_tensor_parallel.mlir").read_text()
    module = parse_module("\n".join(line for line in text.splitlines() if not line.startswith("//")))
    got = {
        str(o.results[0].name_hint): new["split_s"]
        for o, new in overlap_latencies(module, module_accelerator(module, "t"), "t")
    }
    assert got == pytest.approx({"ag": 0.0625e-6, "rs": 4.5e-6, "bg": 1e-6}, rel=1e-12)


def test_the_pass_needs_sequence_parallelism():
    from xdsl.context import Context

    from phaze_ir.ir import parse_module

    with pytest.raises(PhazeError, match="runs on sequence parallelism's all-gathers"):
        OverlapTensorParallelPass().apply(Context(), parse_module(_latency_text(False, "tiled")))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--hw", "h100", "--tp-overlap", "on"), "add --sequence-parallel on"),
        (("--hw", "tpuv4", "--tp-overlap", "auto"), "has no SM count"),
        (("--hw", "h100", "--tp-overlap", "maybe"), "invalid choice"),
    ],
)
def test_phazec_refuses_what_cannot_overlap_before_any_work(flags, message):
    r = run_main("phazec", str(MODELS / "tiny_llama_sdpa.py"), "--devices", "4", *flags, "-q")
    assert r.returncode != 0
    line = r.stderr.strip().splitlines()[-1]
    assert "--tp-overlap" in line and message in line, r.stderr


def test_micro_pipelined_methods_worked_by_hand():
    """torch's micro-pipelined TP (``fused_all_gather_matmul``, ``fused_matmul_reduce_scatter``):
    t chunk GEMMs, the t - 1 copies by copy engine beside them (no SMs taken), the partials'
    sum after a matmul-reduce-scatter; a plain collective adds all of its time."""
    from passes.algorithms.tp_overlap import (
        FUSED_ALL_GATHER_MATMUL,
        FUSED_MATMUL_REDUCE_SCATTER,
        PLAIN,
        micro_pipelined_added_s,
    )

    # TP 4: a 4 s GEMM in chunks of 1.2 s each (smaller, less efficient), 3 copies of 1 s:
    # 1.2 + 3 x max(1, 1.2) = 4.8 s against the whole GEMM's 4 s
    assert micro_pipelined_added_s(FUSED_ALL_GATHER_MATMUL, 3.0, 4.0, 1.2, 4, 0.3) == pytest.approx(0.8)
    # the matmul-reduce-scatter then sums the 4 partials it received: + 0.3 s
    assert micro_pipelined_added_s(FUSED_MATMUL_REDUCE_SCATTER, 3.0, 4.0, 1.2, 4, 0.3) == pytest.approx(1.1)
    # copies longer than the chunks: 1.0 + 3 x 2 - 4 (TE's ring exchange would add 1/132 a hop more)
    assert micro_pipelined_added_s(FUSED_ALL_GATHER_MATMUL, 6.0, 4.0, 1.0, 4, 0.0) == pytest.approx(3.0)
    assert micro_pipelined_added_s(PLAIN, 3.0, 4.0, 1.0, 4, 0.0) == 3.0
    assert micro_pipelined_added_s(FUSED_ALL_GATHER_MATMUL, 3.0, 0.0, 0.0, 4, 0.0) == 3.0  # no GEMM


def test_chunks_are_the_gemm_split_by_its_rows():
    from passes.algorithms.latency import MatmulDesc
    from passes.algorithms.tp_overlap import chunk_gemm, partials_pass

    d = MatmulDesc(
        batch=2, m=4096, n=1024, k=4096, a_elem=2, b_elem=2, c_elem=2, a_bytes=2 * 4096 * 4096 * 2,
        b_bytes=4096 * 1024 * 2, onchip_bytes=64, launches=0,
    )  # fmt: skip
    c = chunk_gemm(d, 8)
    assert (c.batch, c.m, c.n, c.k, c.a_bytes, c.b_bytes) == (1, 1024, 1024, 4096, d.a_bytes // 8, d.b_bytes)
    assert (c.onchip_bytes, c.launches) == (0, 1)  # its own mm kernel
    p = partials_pass(d, 8)
    assert (p.read_bytes, p.write_bytes, p.work) == (d.c_bytes, d.c_bytes // 8, 2 * 4096 * 1024)


@functools.cache
def _inductor_text(overlap: str) -> str:
    from phaze.tools.phazec import _parser, compile_model

    args = _parser().parse_args(
        [str(MODELS / "tiny_llama_sdpa.py"), "--hw", "h100", "--emit", "latency", "--kernels", "inductor"]
        + ["--tp", "2", "--micro-batch", "1", "--sequence-parallel", "on", "--tp-overlap", overlap]
        + ["-q", "--no-cache", "--dtype", "bfloat16"]
    )
    text, failure = compile_model(args, lambda msg: None)
    assert failure is None, failure
    return text


def test_async_tp_fuses_what_inductor_matches_and_leaves_the_rest_exposed():
    """``--kernels inductor --tp-overlap on`` prices torch's micro-pipelined TP: the forward
    all-gather-matmuls and matmul-reduce-scatters, and the backward all-gathers of the output
    gradient with their input-gradient GEMM, are fused (each GEMM's chunks priced at M/t rows);
    the backward's reduce-scatters of an input gradient summed over q, k, v (or the gate and up
    projections), and its all-gathers of a saved input for the weight gradient, match no pattern
    of Inductor's ``micro_pipeline_tp`` and stay whole, where Transformer Engine's rule hid them
    behind the weight-gradient GEMMs."""
    from passes.algorithms.latency import estimate_chip
    from passes.algorithms.tp_overlap import PLAIN, added_s, chunk_gemm, micro_pipelined_added_s, partials_pass
    from passes.cost_view import describe_op
    from passes.graph_view import step_function
    from passes.how_ops_run import overlapped
    from phaze_ir.hardware_ir import module_accelerator
    from phaze_ir.ir import parse_module

    plain, fused = parse_module(_inductor_text("off")), parse_module(_inductor_text("on"))
    assert keys.TP_OVERLAP in fused.attributes
    acc = module_accelerator(fused, "t")
    before = {id(b): _lat(a) for a, b in zip(plain.walk(), fused.walk()) if keys.LATENCY in a.attributes}
    found = overlapped(step_function(fused), micro_pipelined=True)
    kinds = {(o.kind.data, keys.string_of(o, keys.PHASE, "fwd"), m) for o, m, _ in found}
    assert ("all_gather", "fwd", "fused_all_gather_matmul") in kinds
    assert ("reduce_scatter", "fwd", "fused_matmul_reduce_scatter") in kinds
    assert ("all_gather", "bwd", "fused_all_gather_matmul") in kinds  # the output gradient's
    exposed = [o for o, m, _ in found if m == PLAIN and keys.string_of(o, keys.PHASE, "fwd") == "bwd"]
    assert {o.kind.data for o in exposed} == {"all_gather", "reduce_scatter"}
    old = dict((id(o), (m, g)) for o, m, g in overlapped(step_function(fused)))
    for o in exposed:  # priced whole, where TE's rule had it beside the weight-gradient GEMMs
        assert _lat(o) == before[id(o)] > 0
        method, gemms = old[id(o)]
        if gemms:
            assert added_s(method, before[id(o)], sum(_lat(g) for g in gemms), 2, 132, False) < before[id(o)]
    ids = [id(g) for _, _, gemms in found for g in gemms]
    assert len(ids) == len(set(ids))  # each GEMM in one fused op
    for o, method, gemms in found:
        if method == PLAIN:
            continue
        whole = [describe_op(g) for g in gemms]
        descs = [chunk_gemm(d, 2) for d in whole] + [partials_pass(whole[-1], 2)]
        priced = estimate_chip(descs, acc).split[:, 0]
        chunk_s = float(sum(priced[: len(whole)]))
        reduce_s = float(priced[-1]) if o.kind.data == "reduce_scatter" else 0.0
        want = micro_pipelined_added_s(method, before[id(o)], sum(_lat(g) for g in gemms), chunk_s, 2, reduce_s)
        assert _lat(o) == pytest.approx(want, rel=1e-12)
