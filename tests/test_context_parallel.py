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
from passes.algorithms.latency import estimate_op
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
        if backward:  # the off-diagonal step beside K, V; the diagonal last, beside dK, dV
            want = max(hop, off + share * min(hop, off)) + max(hop, local + share * min(hop, local))
        else:  # the diagonal beside the next step's K, V; the last alone
            want = max(hop, local + share * min(hop, local)) + off
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


def test_the_ring_worked_by_hand():
    """The latencies of tests/filecheck/context_parallel.mlir, each attention made a ring of 2 as
    phaze-estimate-latency writes it: a forward kernel of 3 us a step (its hop of 1.128 us
    hides beside the first) is 3 + 3 = 6 us, every op x 2; a backward one of 1 us a step beside
    hops of 1.128 us is 2 x 1.128 = 2.256 us, every op x 2.256."""
    from pathlib import Path

    from passes.how_ops_run import ring_latencies
    from phaze_ir.ir import parse_module

    text = (Path(__file__).parent / "filecheck" / "context_parallel.mlir").read_text()
    module = parse_module("\n".join(line for line in text.splitlines() if not line.startswith("//")))
    ring, kv, scaled = ring_latencies(module, module_accelerator(module, "t"), 2)
    assert kv == 128
    assert ring == pytest.approx(
        {"fwd_step_s": 3e-6, "fwd_hop_s": 1.128e-6, "fwd_ring_s": 6e-6}
        | {"bwd_step_s": 1e-6, "bwd_hop_s": 2.256e-6, "bwd_ring_s": 2.256e-6},
        rel=1e-12,
    )
    got = {str(o.results[0].name_hint): new["split_s"] for o, new in scaled}
    assert got == pytest.approx({"s": 2e-6, "p": 2e-6, "o": 2e-6, "ds": 1.128e-6, "dq": 1.128e-6}, rel=1e-12)


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
