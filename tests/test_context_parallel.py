"""Context parallelism (``--context-parallel``): the degrees a run may take, the ring attention's
time worked by hand, the pass on a real SDPA Llama, and phazec end to end with its exports read
by torchtitan's own config loader."""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from pathlib import Path

import pytest
from conftest import MODELS, run_main

from passes.algorithms import context_parallel as cp
from passes.algorithms.latency import VectorDesc, estimate_op
from passes.context_parallel import ContextParallelPass, attention_kernels
from passes.cost_view import describe_op, skipped_flops
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import LatencyAttr, LayerFlopsAttr, LayerLatencyAttr
from phaze_ir.errors import PhazeError
from phaze_ir.hardware_ir import module_accelerator


def test_auto_tries_the_powers_of_two_that_leave_enough_tokens():
    assert cp.auto_degrees(131072, 64) == (1, 2, 4, 8, 16, 32)  # 4096 tokens a device at 32
    assert cp.auto_degrees(131072, 8) == (1, 2, 4, 8)  # no more than the devices
    assert cp.auto_degrees(8192, 64) == (1, 2)
    assert cp.auto_degrees(4096, 64) == (1,)
    assert cp.auto_degrees(None, 64) == (1,)


@pytest.mark.parametrize(
    ("c", "seq", "devices", "message"),
    [
        (3, 32, 8, "not a multiple of 2·c = 6"),
        (16, 32, 8, "expected at most --devices 8"),
        (2, None, 8, "the model has no sequence length"),
    ],
)
def test_a_degree_that_cannot_split_the_sequence_is_refused(c, seq, devices, message):
    with pytest.raises(cp.ContextParallelError, match=message):
        cp.check_degree(c, seq, devices)
    cp.check_degree(1, None, 1)  # no CP: nothing to split


@pytest.mark.parametrize("text", ["0", "-2", "x", "2.5", "", "auto2", "\u0662"])
def test_bad_values_are_refused(text):
    assert cp.context_parallel_problem(text) == "expected auto or a degree N >= 1"
    assert cp.context_parallel_problem("auto") is None and cp.context_parallel_problem("8") is None


@pytest.mark.parametrize("text", ["2147483648", "99999999999", "9" * 5000])
def test_a_degree_past_any_cluster_says_its_bound_not_n_at_least_1(text):
    assert cp.context_parallel_problem(text) == "expected auto or a degree from 1 to 2.15 G (2,147,483,647)"
    assert cp.context_parallel_problem("2147483647") is None


def test_ring_steps_worked_by_hand():
    """Transformer Engine's order (AttnFuncWithCPAndKVP2P): forward, the diagonal first and each
    step but the last beside the next one's hop; backward, the diagonal last, every step beside
    a hop (K, V first; K, V with dK, dV between; dK, dV alone last)."""
    fwd = cp.forward_ring(1.0, 0.8, 0.5, 4)
    assert fwd == [(1.0, 0.5), (0.8, 0.5), (0.8, 0.5), (0.8, 0.0)]
    # compute-bound: each hop hides behind its step, which it slows by 10 % of the overlap:
    # (1 + 0.05) + 2 x (0.8 + 0.05) + 0.8 = 3.55 s
    assert math.isclose(cp.ring_s(fwd, 0.1), 3.55)
    bwd = cp.backward_ring(1.0, 0.8, 0.5, 1.0, 4)
    assert bwd == [(0.8, 0.5), (0.8, 1.0), (0.8, 1.0), (1.0, 0.5)]
    # (0.8 + 0.05) + 2 x max(1.0, 0.8 + 0.08) + (1 + 0.05) = 3.9 s
    assert math.isclose(cp.ring_s(bwd, 0.1), 3.9)
    # network-bound: the hops (3 s) set the pace: 3 x 3 + 0.8 = 9.8 s
    assert math.isclose(cp.ring_s(cp.forward_ring(1.0, 0.8, 3.0, 4), 0.1), 9.8)
    assert cp.forward_ring(1.0, 0.8, 3.0, 1) == cp.backward_ring(1.0, 0.8, 3.0, 6.0, 1) == [(1.0, 0.0)]  # no ring
    # c = 2: one step of each kind, each beside one hop of K, V (backward: the second of dK, dV)
    assert cp.backward_ring(1.0, 0.8, 0.5, 1.0, 2) == [(0.8, 0.5), (1.0, 0.5)]


def _moved(passes) -> int:
    return sum(d.read_bytes + d.write_bytes for d in passes)


def test_the_rings_memory_bound_passes_worked_by_hand():
    """TE 2.20's PyTorch passes around the ring's steps (AttnFuncWithCPAndKVP2P), one device of
    Llama 2 7B at 128k tokens, TP 4, CP 4 (NeMo's row): 32k tokens x 8 heads x 128 x 2 B = 64 MiB of
    Q (and of O), K and V 128 MiB; each step priced with the kind its slowest device runs."""
    mib = 2**20
    t = cp.RingTensors(q=64 * mib, kv=128 * mib, out=64 * mib)
    fwd = cp.forward_passes(t, 4)
    # K, V concatenated into the send buffer; beside each off-diagonal step the halves of K and V
    # made contiguous (the lower triangle's 128 MiB moved, more than Q's half, 64); after the ring
    # the first output scaled (64 read, 64 written), the three others scaled and added (3 x 192)
    assert _moved(fwd.before) == 256 * mib and fwd.beside[0] == ()
    assert [_moved(ds) for ds in fwd.beside[1:]] == [128 * mib] * 3 and fwd.beside[1][0].launches == 2
    assert _moved(fwd.end) == (128 + 3 * 192) * mib and fwd.after == ()
    bwd = cp.backward_passes(t, 4)
    # K, V copied into the send buffer; the off-diagonal steps are the upper triangle's (halves of
    # Q, O, dO made contiguous: 192; dq's half copied 64, then added 96; all of dK, dV copied 256,
    # then added 384), more than the lower's (K, V halves 128; all of dq 128, then 192; half of
    # dK, dV 128, then 192); the diagonal adds all of dq (192) and, after its hop, of dK, dV (384)
    assert _moved(bwd.before) == 256 * mib
    assert [_moved(ds) for ds in bwd.beside] == [(192 + 64) * mib, (192 + 96) * mib, (192 + 96) * mib, 192 * mib]
    assert [_moved(ds) for ds in bwd.after] == [256 * mib, 384 * mib, 384 * mib, 384 * mib]
    # In all, 21 and 42 passes over Q's bytes.
    assert _moved([*fwd.before, *(d for ds in fwd.beside for d in ds), *fwd.end]) == 21 * t.q
    assert _moved([*bwd.before, *(d for ds in bwd.beside + bwd.after for d in ds)]) == 42 * t.q
    # Grouped-query K, V (a quarter of the heads): the upper triangle's half of Q moves more.
    gqa = cp.forward_passes(cp.RingTensors(q=64 * mib, kv=32 * mib, out=64 * mib), 4)
    assert _moved(gqa.beside[1]) == 64 * mib and gqa.beside[1][0].launches == 1
    # Where they run: those beside a step lengthen it, the others take the stream alone.
    seconds = {d: 1.0 for d in fwd.descs()}
    steps = fwd.around(cp.forward_ring(10.0, 8.0, 5.0, 4), seconds.__getitem__)
    assert steps == [(1.0, 0.0), (10.0, 5.0), (9.0, 5.0), (9.0, 5.0), (9.0, 0.0), (4.0, 0.0)]
    steps = bwd.around(cp.backward_ring(10.0, 8.0, 5.0, 9.0, 4), {d: 1.0 for d in bwd.descs()}.__getitem__)
    assert steps[:3] == [(1.0, 0.0), (10.0, 5.0), (1.0, 0.0)] and steps[-2:] == [(11.0, 5.0), (1.0, 0.0)]
    # No ring, no passes: the step as traced.
    assert cp.forward_passes(t, 1) == cp.backward_passes(t, 1) == cp.RingPasses()
    assert cp.RingPasses().around([(3.0, 0.0)], seconds.__getitem__) == [(3.0, 0.0)]


def test_an_off_diagonal_step_is_half_the_square_unmasked_at_the_unmasked_rate():
    """The S/c x S/c causal GEMM of the traced local attention against its off-diagonal twin:
    half its M rows, no mask; on the h100, at cuDNN's unmasked rate at the same sequence, which
    is faster than the causal one (FA3 paper, Figure 5: 609 against 518 TFLOP/s at 4k)."""
    import dataclasses

    from passes.algorithms import attention as at
    from passes.algorithms.latency import MatmulDesc, causal_fraction, estimate_op
    from phaze_ir.hardware import load_hardware

    h100 = load_hardware("h100")
    s, d, heads = 4096, 128, 32
    qk = MatmulDesc(
        batch=heads, m=s, n=s, k=d, a_elem=2, b_elem=2, c_elem=2, a_bytes=heads * s * d * 2, b_bytes=heads * s * d * 2,
        rhs_batched=True, onchip_bytes=heads * s * s * 2, causal=True, launches=0, attention=1,
        backend=at.BACKENDS.index("cudnn"),
    )  # fmt: skip
    twin = cp.off_diagonal_gemm(qk)
    assert twin == dataclasses.replace(
        qk, m=s // 2, a_bytes=qk.a_bytes // 2, onchip_bytes=qk.onchip_bytes // 2, causal=False
    )
    assert cp.off_diagonal_gemm(twin) is None and cp.off_diagonal_gemm(dataclasses.replace(qk, attention=0)) is None
    peak = h100.peak_tensor_flops
    table = at.load("h100_sxm")
    flops = 2 * heads * s * s * d
    diagonal = flops * float(causal_fraction(s, s, d)) / (peak * at.efficiency(table, "cudnn", "fwd", True, s, d, peak))
    off = flops / 2 / (peak * at.efficiency(table, "cudnn", "fwd", False, s, d, peak))
    assert estimate_op(qk, h100).split_s == pytest.approx(diagonal, rel=1e-9)
    assert estimate_op(twin, h100).split_s == pytest.approx(off, rel=1e-9)
    assert off / diagonal == pytest.approx((s / (s + 1)) * 518 / 609, rel=1e-9)


@functools.cache
def _latency_module(seq_len: int, stage: str = "latency"):
    """tiny_llama_sdpa at ``seq_len`` tokens (float16, eager kernels), priced on the h100 (or
    compiled to ``stage``)."""
    from phaze.tools.phazec import _parser, compile_model

    args = _parser().parse_args(
        [str(MODELS / "tiny_llama_sdpa.py"), "--hw", "h100", "--emit", stage, "--kernels", "eager"]
        + ["--seq-len", str(seq_len), "--micro-batch", "1", "--tp", "1", "-q", "--no-cache"]
    )
    text, failure = compile_model(args, lambda msg: None)
    assert failure is None, failure
    return text


def _parsed(seq_len: int, stage: str = "latency"):
    from phaze_ir.ir import parse_module

    return parse_module(_latency_module(seq_len, stage))


def _split(o) -> float:
    return float(keys.require(o, keys.LATENCY, LatencyAttr).as_dict()["split_s"])


def test_the_pass_makes_each_attention_a_ring_of_c_steps():
    """One device of CP 2 at 32 tokens: the step traced at 16; each attention kernel's ops take
    the ring's time (the traced diagonal step and an unmasked off-diagonal one, the hops of K and
    V beside them in Transformer Engine's order), every other op as traced; the layer sums,
    tokens, FLOPs follow."""
    from xdsl.context import Context

    from passes.estimate_latency import EstimateLatencyPass

    before, after = _parsed(16), _parsed(16, "tiled")
    ContextParallelPass(degree=2).apply(Context(), after)  # says the attentions are rings
    EstimateLatencyPass().apply(Context(), after)  # prices them so
    acc = module_accelerator(after, "test")
    groups = attention_kernels(after)
    assert len(groups) == 4  # 2 layers, forward and backward
    in_group = {id(o) for ops in groups.values() for o in ops}
    old = {i: _split(o) for i, o in enumerate(before.walk()) if keys.LATENCY in o.attributes}
    new = {i: _split(o) for i, o in enumerate(after.walk()) if keys.LATENCY in o.attributes}
    ops = [o for o in after.walk()]
    level = acc.network[0]  # a ring of 2 at stride 1: inside the node
    for ops_g in groups.values():
        first = next(o for o in ops_g if isinstance(o, ph.MatmulOp))
        backward = keys.string_of(first, keys.PHASE) == "bwd"
        # K and V as the kernel reads them, before the GQA repeat: 1 x 2 K/V heads x 16 tokens x 16 x 2 B each.
        kv = 2 * 1 * 2 * 16 * 16 * 2
        hop = level.latency_s + kv / level.bandwidth_Bps
        idx = [ops.index(o) for o in ops_g]
        local = sum(old[i] for i in idx)
        # the off-diagonal step: the GEMMs unmasked over half the rows, the other ops as traced
        gemms = [(i, o) for i, o in zip(idx, ops_g) if isinstance(o, ph.MatmulOp)]
        off = local + sum(estimate_op(cp.off_diagonal_gemm(describe_op(o)), acc).split_s - old[i] for i, o in gemms)
        assert off > 0  # (about the traced step here: 16 tokens are bound by their bytes, not the rate)
        share = level.collective_compute_share or 0.0  # (none given inside an h100 node)
        # TE's memory-bound passes around the steps over one device's Q, O (4 heads x 16 tokens x
        # 16 x 2 B) and K, V (as above), each priced as a vector op: `moved` bytes read, written.
        q = out = 4 * 16 * 16 * 2

        def moved(read: int, written: int, launches: int = 1) -> float:
            return estimate_op(
                VectorDesc(work=written // 2, read_bytes=read, write_bytes=written, launches=launches), acc
            ).split_s

        if backward:  # the off-diagonal step beside K, V; the diagonal last, beside dK, dV
            # K, V into the send buffer; beside the first step the halves of Q, O, dO made
            # contiguous and dq's half copied (the upper triangle's: it moves more than the lower's
            # halves of K, V and whole dq), then its dK, dV copied; beside the diagonal dq added,
            # then dK, dV added to the received ones
            first = off + moved(q // 2 + out, q // 2 + out, 3) + moved(q // 2, q // 2)
            last = local + moved(2 * q, q)
            want = (
                moved(kv, kv)
                + max(hop, first + share * min(hop, first))
                + moved(kv, kv, 2)
                + max(hop, last + share * min(hop, last))
                + moved(2 * kv, kv, 2)
            )
        else:  # the diagonal beside the next step's K, V; the last alone
            # K, V concatenated into the send buffer; the off-diagonal step's halves of K and V
            # made contiguous (as many bytes as Q's half: the lower triangle's, taken first); the two
            # partial outputs merged after the ring (the first scaled, the second scaled and added)
            want = (
                moved(kv, kv)
                + max(hop, local + share * min(hop, local))
                + off
                + moved(kv // 2, kv // 2, 2)
                + moved(out, out)
                + moved(2 * out, out)
            )
        assert math.isclose(sum(new[i] for i in idx), want, rel_tol=1e-12)
    for i, o in enumerate(ops):
        if i in old and id(o) not in in_group:
            assert new[i] == old[i]
    # The layers' sums are the ops' again.
    sums: dict[tuple[int, str], float] = {}
    for o in ops:
        if keys.LATENCY in o.attributes and keys.LAYER in o.attributes:
            k = (o.attributes[keys.LAYER].value.data, keys.string_of(o, keys.PHASE, "fwd"))
            sums[k] = sums.get(k, 0.0) + _split(o)
    for r in keys.records_of(after, keys.LAYER_LATENCY, LayerLatencyAttr):
        d = r.as_dict()
        for phase in ("fwd", "bwd"):
            assert math.isclose(float(d[f"{phase}_s"]), sums.get((int(d["index"]), phase), 0.0), rel_tol=1e-12)
    # A whole sample: 32 tokens (16 traced); the GEMMs' FLOPs twice, attention's four times (the
    # importer's phaze.attention_flops: the sharded step's attention times its width, 1); the
    # layers' FLOPs count each attention twice (its two steps).
    assert keys.int_of(after, keys.SEQ_LEN, 0) == 16 and keys.int_of(after, keys.CONTEXT_PARALLEL, 1) == 2
    assert keys.sample_seq_len(after) == 32
    attention = 3 * sum(
        o.flops()
        for g in groups.values()
        for o in g
        if isinstance(o, ph.MatmulOp) and keys.string_of(o, keys.PHASE) == "fwd"
    )
    flops = keys.int_of(before, keys.MODEL_FLOPS, 0)
    assert keys.int_of(after, keys.ATTENTION_FLOPS, 0) == attention
    assert keys.sample_model_flops(after) == 2 * (flops - attention) + 4 * attention
    # phaze.layers stays phaze-group-layers' (the ops as traced); phaze.layer_flops, what the
    # devices run, is phaze-estimate-latency's
    assert after.attributes[keys.LAYERS] == before.attributes[keys.LAYERS]
    grew = sum(int(r.as_dict()["fwd_flops"]) for r in keys.records_of(after, keys.LAYER_FLOPS, LayerFlopsAttr)) - sum(
        int(r.as_dict()["fwd_flops"]) for r in keys.records_of(before, keys.LAYER_FLOPS, LayerFlopsAttr)
    )
    # (the off-diagonal step: half the GEMMs' square, unmasked; its other ops as the traced kernel computes them)
    assert grew == sum(
        o.flops() // 2 if isinstance(o, ph.MatmulOp) else o.flops() - skipped_flops(o)
        for g in groups.values()
        for o in g
        if keys.string_of(o, keys.PHASE) == "fwd"
    )
    assert 0 < grew < sum(o.flops() for g in groups.values() for o in g if keys.string_of(o, keys.PHASE) == "fwd")
    # Run twice, it would scale the tokens and FLOPs twice: refused.
    with pytest.raises(PhazeError, match="priced for context parallelism already"):
        ContextParallelPass(degree=2).apply(Context(), after)
    # Priced again, the ring stays (issue 56: it was dropped when a later pass rescaled the ops).
    text = str(after)
    EstimateLatencyPass().apply(Context(), after)
    assert str(after) == text
    # Marked after the pricing, the ring would be said and not priced: refused.
    with pytest.raises(PhazeError, match="priced already .* run it before phaze-estimate-latency"):
        ContextParallelPass(degree=2).apply(Context(), _parsed(16))


def test_the_energy_of_a_ring_is_its_c_steps():
    """Under CP 4 each op of a fused attention kernel spends what the ring's four steps do: the
    traced op once and its off-diagonal twin three times (the op itself where it has none), its
    HBM part summed so and its die's part at most that (the power limit's clock over the ring's
    time); every other op as without CP, and the layers' sums grow by the ring's work."""
    from xdsl.context import Context

    from passes.algorithms.energy import estimate_energy
    from passes.estimate_energy import EstimateEnergyPass
    from passes.estimate_latency import EstimateLatencyPass
    from phaze_ir.attributes import EnergyAttr, LayerEnergyAttr

    c = 4
    plain, ring = _parsed(16, "tiled"), _parsed(16, "tiled")
    EstimateLatencyPass().apply(Context(), plain)
    ContextParallelPass(degree=c).apply(Context(), ring)
    EstimateLatencyPass().apply(Context(), ring)
    for m in (plain, ring):
        EstimateEnergyPass().apply(Context(), m)
    acc = module_accelerator(ring, "test")
    in_ring = {id(o) for ops in attention_kernels(ring).values() for o in ops}
    assert in_ring
    plain_ops = [o for o in plain.walk() if keys.ENERGY in o.attributes]
    ring_ops = [o for o in ring.walk() if keys.ENERGY in o.attributes]
    assert len(plain_ops) == len(ring_ops)
    twins = 0
    for p, o in zip(plain_ops, ring_ops):
        before = keys.require(p, keys.ENERGY, EnergyAttr).as_dict()
        after = keys.require(o, keys.ENERGY, EnergyAttr).as_dict()
        if id(o) not in in_ring:
            assert after == before
            continue
        traced = estimate_energy(describe_op(o), acc)
        twin = cp.off_diagonal_gemm(describe_op(o)) if isinstance(o, ph.MatmulOp) else None
        twins += twin is not None
        off = traced if twin is None else estimate_energy(twin, acc)
        assert float(after["hbm_j"]) == pytest.approx(traced.hbm_j + (c - 1) * off.hbm_j, rel=1e-12)
        die = traced.compute_j + (c - 1) * off.compute_j
        assert float(after["compute_j"]) <= die * (1 + 1e-12)  # the die's, at most: its clock may be lower
    assert twins == 14  # a layer's forward kernel's 2 causal GEMMs and its backward's 5 (scores again, dV, dP, dQ, dK)
    grew = [
        float(a.as_dict()["fwd_j"]) - float(b.as_dict()["fwd_j"])
        for a, b in zip(
            keys.records_of(ring, keys.LAYER_ENERGY, LayerEnergyAttr),
            keys.records_of(plain, keys.LAYER_ENERGY, LayerEnergyAttr),
        )
    ]
    assert sum(x > 0 for x in grew) == 2 and min(grew) >= 0  # the two blocks' forward attentions


def test_the_ring_worked_by_hand():
    """The latencies of tests/filecheck/context_parallel.mlir, each attention made a ring of 2 as
    phaze-estimate-latency writes it: a forward kernel of 3 us a step (its hop of 1.128 us
    hides beside the first) is 3 + 3 = 6 us, and TE's passes on the toy chip's HBM of 16 GB/s
    add 44 ns (K, V into the send buffer 16, the off-diagonal step's halves of K, V 8, the
    outputs merged 8 + 12): 6.044 us, every op x 6.044/3; a backward one of 1 us a step beside
    hops of 1.128 us is 2 x 1.128 = 2.256 us, and 56 ns of passes not beside a hop (K, V into the
    send buffer 16, the first step's dK, dV copied 16, the diagonal's added 24): 2.312 us, every
    op x 2.312."""
    from pathlib import Path

    from passes.how_ops_run import ring_latencies
    from phaze_ir.ir import parse_module

    text = (Path(__file__).parent / "filecheck" / "context_parallel.mlir").read_text()
    module = parse_module("\n".join(line for line in text.splitlines() if not line.startswith("//")))
    ring, kv, scaled = ring_latencies(module, module_accelerator(module, "t"), 2)
    assert kv == 128
    assert ring == pytest.approx(
        {"fwd_step_s": 3.022e-6, "fwd_hop_s": 1.128e-6, "fwd_ring_s": 6.044e-6}
        | {"bwd_step_s": 1.042e-6, "bwd_hop_s": 2.256e-6, "bwd_ring_s": 2.312e-6},
        rel=1e-12,
    )
    got = {str(o.results[0].name_hint): new["split_s"] for o, new in scaled}
    fwd, bwd = 6.044 / 3 * 1e-6, 2.312 * 0.5e-6
    assert got == pytest.approx({"s": fwd, "p": fwd, "o": fwd, "ds": bwd, "dq": bwd}, rel=1e-12)


def test_the_whole_sample_is_read_from_the_traced_keys():
    """tests/filecheck/context_parallel.mlir marked at degree 2: phaze.seq_len and
    phaze.model_flops stay the importer's (one writer each); the whole sample's are c times the
    tokens and c times the GEMMs but c² times the attention (phaze.attention_flops):
    2 * (10000 - 1536) + 4 * 1536 = 23072.  Without the attention's share, c times all of it."""
    from xdsl.context import Context

    from phaze_ir.ir import parse_module

    text = (Path(__file__).parent / "filecheck" / "context_parallel.mlir").read_text()
    text = re.sub(r", phaze.latency = #phaze.latency<[^>]*>", "", text)  # as the RUN lines' sed
    module = parse_module("\n".join(line for line in text.splitlines() if not line.startswith("//")))
    ContextParallelPass(degree=2).apply(Context(), module)
    assert (keys.int_of(module, keys.SEQ_LEN, 0), keys.int_of(module, keys.MODEL_FLOPS, 0)) == (4, 10000)
    assert (keys.sample_seq_len(module), keys.sample_model_flops(module)) == (8, 23072)
    module.attributes.pop(keys.ATTENTION_FLOPS)
    assert keys.sample_model_flops(module) == 20000
    module.attributes.pop(keys.CONTEXT_PARALLEL)
    assert (keys.sample_seq_len(module), keys.sample_model_flops(module)) == (4, 10000)


def test_the_pass_refuses_a_step_without_fused_attention(tiny_gpt2_module):
    from xdsl.context import Context

    from phaze.options import Options
    from phaze.pipeline import compile_from, load_accelerator
    from phaze_ir.hardware_ir import set_accelerator

    module = tiny_gpt2_module
    set_accelerator(module, load_accelerator("h100"))
    compile_from(module, "training", "tiled", 1, Options(hw="h100"))
    with pytest.raises(PhazeError, match="needs a fused attention"):
        ContextParallelPass(degree=2).apply(Context(), module)


def _phazec(tmp_path, *extra: str) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "plan.json"
    model = str(MODELS / "tiny_llama_sdpa.py")
    r = run_main(
        "phazec", model, "--hw", "h100", "--devices", "8", "--global-batch", "8", "--micro-batch", "1",
        "--kernels", "eager", "--json", str(out), "-q", "--cache", str(tmp_path / "cache"), *extra,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text())


def test_phazec_places_a_context_parallel_run_and_exports_it(tmp_path):
    """``--context-parallel 2`` at TP 2 on 8 devices: a plan of 2 x 2 devices a replica, its
    activations half those of the same run without CP, launched by both exports; torchtitan's
    own config loader reads its degrees."""
    titan = pytest.importorskip("torchtitan.config", reason="torchtitan 0.3.0 is installed by .ci/run (--no-deps)")
    from torchtitan.distributed.parallel_dims import ParallelDims

    # 16-bit weights and activations, as the default was before a GPU's became bf16 autocast
    # (under which the saved activations measured here were 0.67 of the run without CP, not < 0.6)
    flags = ("--tp", "2", "--zero", "3", "--dtype", "bfloat16", "--placement", "expert:1,2,2")
    mega, titan_file = tmp_path / "m.args", tmp_path / "t.args"
    with_cp = _phazec(tmp_path, *flags, "--context-parallel", "2", "--export", "megatron", str(mega), "--export",
                      "torchtitan", str(titan_file))  # fmt: skip
    assert (with_cp["dp"], with_cp["cp"], with_cp["tp"], with_cp["devices_used"]) == (2, 2, 2, 8)
    assert with_cp["candidates"][0]["cp"] == 2
    assert "CP 2" in with_cp["summary"]["placement"]
    ring = with_cp["cp_ring"]  # one micro-batch on one device: each ring two steps, one hop
    assert ring["fwd_ring_s"] >= 2 * ring["fwd_step_s"] > 0 and ring["bwd_hop_s"] > ring["fwd_hop_s"] > 0
    from phaze.search.report import render

    page = render(with_cp)  # the report draws the ring
    assert "<h2>Context-parallel ring</h2>" in page and 'aria-label="context-parallel ring"' in page
    without = _phazec(tmp_path, *flags[:6], "--placement", "expert:1,4,2")
    acts = [p["stages"][0]["memory"]["activations"] for p in (with_cp, without)]
    assert acts[0] < 0.6 * acts[1]  # half the tokens a device
    m_lines = mega.read_text().splitlines()
    assert "--context-parallel-size=2" in m_lines and "--cp-comm-type=p2p" in m_lines
    t_lines = titan_file.read_text().splitlines()
    # As written, nothing prepended: its --module is the flavour file phazec wrote beside it.
    assert t_lines[:2] == ["--module=t_args_flavour", "--config=phaze_plan"]
    sys.path.insert(0, str(tmp_path))
    try:
        config = titan.ConfigManager().parse_args(t_lines)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("t_args_flavour", None)
    par = config.parallelism
    dims = ParallelDims.from_config(par, world_size=8)
    assert (dims.cp, dims.tp, dims.dp_shard, dims.dp_replicate) == (2, 2, 2, 1)


def test_phazec_refuses_bad_degrees_before_any_work(tmp_path):
    model = str(MODELS / "tiny_llama_sdpa.py")
    for value, message in (("3", "not a multiple of 2·c = 6"), ("x", "expected auto or a degree N >= 1")):
        r = run_main("phazec", model, "--hw", "h100", "--devices", "8", "--context-parallel", value, "-q")
        assert r.returncode != 0
        line = r.stderr.strip().splitlines()[-1]
        assert "--context-parallel" in line and message in line, r.stderr
    r = run_main("phazec", model, "--hw", "h100", "--devices", "8", "--placement", "expert:1,4,2", "--context-parallel",
                 "2", "-q")  # fmt: skip
    assert r.returncode != 0 and "expert:1,4,2 x --context-parallel 2 needs 16 devices" in r.stderr
    r = run_main("phazec", model, "--devices", "8", "--seq-len", "64", "--context-parallel", "3", "-q")  # the search
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "not a multiple of 2·c = 6" in r.stderr, r.stderr
    space = str(Path(__file__).parent / "data" / "tiny_space.toml")  # a space without the FP8 datapath
    r = run_main("phazec", model, "--devices", "8", "--dtype", "fp8", "--space", space, "-q")
    assert r.returncode != 0 and "no chip of the space has the FP8 datapath" in r.stderr.strip().splitlines()[-1]


def test_model_flops_are_the_whole_sequences_at_any_tp_and_cp(tmp_path):
    """MFU's model FLOPs of a batch are the model's, whatever splits the sequence: at TP 2 the
    same with CP 2 as without (the attention of the sharded step counted at the whole width)."""
    got = []
    for c, dp in ((1, 2), (2, 1)):
        flags = ("--tp", "2", "--placement", f"expert:1,{dp},2", "--context-parallel", str(c))
        plan = _phazec(tmp_path / f"cp{c}", *flags)
        s = plan["summary"]
        got.append((s["model_flops_palm_per_batch"], s["model_flops_causal_per_batch"]))
    assert got[0] == pytest.approx(got[1], rel=1e-12)
