"""Fused attention as its kernels run it, by shape (passes/algorithms/attention.py), and the
causal half counted once in time, HFU and MFU (phaze/plan/summary.py)."""

from __future__ import annotations

import csv
import functools
import math
from pathlib import Path

import pytest
from conftest import MODELS

from passes.algorithms import attention as at
from passes.algorithms.kernels import attention_backend
from passes.algorithms.latency import MatmulDesc, causal_fraction, estimate_op
from phaze.plan import summary as plan_summary
from phaze_ir.hardware import load_hardware

ROOT = Path(__file__).resolve().parent.parent
H100 = load_hardware("h100")
PEAK = H100.peak_tensor_flops
TABLE = at.load("h100_sxm")


# --- the table and its lookup -----------------------------------------------------------------


def test_the_h100_names_its_table_and_every_curve_has_a_source():
    assert H100.calibration.attention_kernels == "h100_sxm"
    assert {"flash2", "flash3", "cudnn"} <= TABLE.backends()
    for c in TABLE.curves:
        assert c.source.strip() and len(c.seq) == len(c.tflops)
        assert max(c.tflops) * 1e12 < PEAK  # no kernel above the peak


def test_published_points_are_returned_as_published():
    # FA3 paper, Figure 5: cuDNN causal forward, head dim 128, at 4k tokens: 518 TFLOP/s
    assert at.tflops(TABLE, "cudnn", "fwd", True, 4096, 128) == 518
    assert at.tflops(TABLE, "flash3", "bwd", False, 16384, 64) == 474
    assert at.efficiency(TABLE, "flash2", "fwd", False, 1024, 128, PEAK) == pytest.approx(350e12 / PEAK)


def test_the_sequence_is_interpolated_in_log2_and_held_at_the_ends():
    lo, hi = at.tflops(TABLE, "cudnn", "fwd", True, 2048, 128), at.tflops(TABLE, "cudnn", "fwd", True, 4096, 128)
    mid = at.tflops(TABLE, "cudnn", "fwd", True, 2896, 128)  # 2^11.5
    assert mid == pytest.approx(lo + (hi - lo) * (math.log2(2896) - 11), rel=1e-12)
    assert at.tflops(TABLE, "cudnn", "fwd", True, 131072, 128) == at.tflops(TABLE, "cudnn", "fwd", True, 16384, 128)
    assert at.tflops(TABLE, "cudnn", "fwd", True, 64, 128) == at.tflops(TABLE, "cudnn", "fwd", True, 512, 128)


def test_the_head_dimension_is_interpolated_between_the_tables_and_held_outside():
    d64 = at.tflops(TABLE, "flash2", "fwd", False, 4096, 64)
    d128 = at.tflops(TABLE, "flash2", "fwd", False, 4096, 128)
    assert at.tflops(TABLE, "flash2", "fwd", False, 4096, 90) == pytest.approx(
        d64 + (d128 - d64) * (math.log2(90) - 6), rel=1e-12
    )
    assert at.tflops(TABLE, "flash2", "fwd", False, 4096, 16) == d64
    assert at.tflops(TABLE, "flash2", "fwd", False, 4096, 256) == d128


def test_causal_masks_and_backward_passes_are_slower():
    for backend in ("flash2", "flash3", "cudnn"):
        for seq in (1024, 4096, 32768):
            fwd = at.tflops(TABLE, backend, "fwd", False, seq, 128)
            assert at.tflops(TABLE, backend, "fwd", True, seq, 128) < fwd
            assert at.tflops(TABLE, backend, "bwd", False, seq, 128) < fwd


def test_a_causal_backward_is_the_unmasked_one_at_the_forwards_causal_ratio():
    # the FA3 paper publishes no causal backward: bwd(causal) = bwd(no mask) * fwd(causal) / fwd(no mask)
    for seq, d in ((1024, 128), (8192, 64), (65536, 128)):
        want = (
            at.tflops(TABLE, "cudnn", "bwd", False, seq, d)
            * at.tflops(TABLE, "cudnn", "fwd", True, seq, d)
            / at.tflops(TABLE, "cudnn", "fwd", False, seq, d)
        )
        assert at.tflops(TABLE, "cudnn", "bwd", True, seq, d) == pytest.approx(want, rel=1e-12)


def _table(*extra: dict) -> at.AttentionTable:
    base = {"backend": "flash2", "causal": False, "head_dim": 128, "seq": [1024, 4096], "source": "test"}
    curves = [
        base | {"pass": "fwd", "tflops": [100, 200]},
        base | {"pass": "bwd", "tflops": [50, 100]},
        *extra,
    ]
    return at.parse("test", {"curve": curves})


def test_gqa_takes_the_curves_of_the_largest_ratio_up_to_the_one_asked():
    grouped = {
        "backend": "flash2", "pass": "fwd", "causal": False, "head_dim": 128, "gqa": 4,
        "seq": [1024, 4096], "tflops": [120, 240], "source": "test",
    }  # fmt: skip
    t = _table(grouped)
    assert at.tflops(t, "flash2", "fwd", False, 4096, 128, gqa=1) == 200
    assert at.tflops(t, "flash2", "fwd", False, 4096, 128, gqa=2) == 200  # none at 2: multi-head
    assert at.tflops(t, "flash2", "fwd", False, 4096, 128, gqa=4) == 240
    assert at.tflops(t, "flash2", "fwd", False, 4096, 128, gqa=8) == 240
    # the published H100 figures are multi-head: a GQA shape takes them
    assert at.tflops(TABLE, "cudnn", "fwd", True, 8192, 128, gqa=4) == at.tflops(TABLE, "cudnn", "fwd", True, 8192, 128)


def test_a_kernel_the_table_lacks_is_not_priced_by_it():
    assert at.tflops(TABLE, "efficient", "fwd", True, 4096, 128) is None
    assert at.efficiency(_table(), "cudnn", "fwd", False, 4096, 128, PEAK) is None
    # no causal forward either: the causal backward cannot be derived
    assert at.tflops(_table(), "flash2", "bwd", True, 4096, 128) is None


@pytest.mark.parametrize(
    "change, message",
    [
        ({"backend": "fa9"}, "backend = 'fa9'"),
        ({"pass": "both"}, "pass = 'both'"),
        ({"seq": [4096, 1024]}, "expected increasing integers"),
        ({"tflops": [100]}, "same length"),
        ({"tflops": [0, 100]}, "expected numbers above 0"),
        ({"source": ""}, "source"),
        ({"head_dim": 0}, "head_dim = 0"),
        ({"speed": 1}, "unknown key 'speed'"),
    ],
)
def test_a_bad_table_is_refused_in_one_line(change, message):
    curve = {
        "backend": "flash2", "pass": "fwd", "causal": False, "head_dim": 128,
        "seq": [1024, 4096], "tflops": [100, 200], "source": "test",
    } | change  # fmt: skip
    with pytest.raises(ValueError, match=message) as e:
        at.parse("bad", {"curve": [curve]})
    assert "\n" not in str(e.value)


def test_the_h100_table_agrees_with_our_own_h100_measurements():
    """data/h100/attention.csv: torch 2.11's SDPA (cuDNN on sm_90), causal, head dim 128, at
    least 64 heads x batch: the table's cuDNN forward + backward within 20 % of each measured
    call (a forward + backward of 3.5 forwards' FLOPs)."""
    times: dict[tuple, dict[str, float]] = {}
    with (ROOT / "data" / "h100" / "attention.csv").open() as f:
        for r in csv.DictReader(f):
            if r["impl"] == "fused" and r["head_dim"] == "128" and int(r["batch"]) * int(r["heads"]) >= 64:
                key = (int(r["batch"]), int(r["heads"]), int(r["seq"]))
                times.setdefault(key, {})[r["pass"]] = float(r["time_s"])
    assert len(times) >= 10
    for (b, h, s), t in times.items():
        fwd_flops = 4 * b * h * s * s * 128 / 2
        priced = fwd_flops / (at.tflops(TABLE, "cudnn", "fwd", True, s, 128) * 1e12) + 2.5 * fwd_flops / (
            at.tflops(TABLE, "cudnn", "bwd", True, s, 128) * 1e12
        )
        assert priced == pytest.approx(t["fwd+bwd"], rel=0.2), (b, h, s)


# --- which kernel each runtime runs -----------------------------------------------------------


@pytest.mark.parametrize(
    "runtime, cc, traced, want",
    [
        ("eager", 9.0, "_scaled_dot_product_flash_attention", "cudnn"),  # cuDNN first on sm_90
        ("inductor", 10.0, "_scaled_dot_product_efficient_attention_backward_2", "cudnn"),
        ("eager", 8.0, "_scaled_dot_product_flash_attention_backward", "flash2"),
        ("eager", 8.0, "_scaled_dot_product_efficient_attention", "efficient"),
        ("megatron", 9.0, "_scaled_dot_product_flash_attention", "cudnn"),  # TE: FusedAttention on Hopper+
        ("megatron", 8.0, "_scaled_dot_product_flash_attention", "flash2"),
        ("ops", 9.0, "_scaled_dot_product_flash_attention", None),  # no fused kernel
        ("eager", None, "_scaled_dot_product_flash_attention", None),  # not a CUDA GPU
        ("eager", 9.0, "native_dropout", None),
        # cuDNN takes dropout in 1/16ths only: GPT-2's 0.1 runs the kernel traced (flash)
        ("eager", 9.0, "_scaled_dot_product_flash_attention_2 dropout 0.1 causal", "flash2"),
        ("eager", 9.0, "_scaled_dot_product_flash_attention dropout 0.125 causal", "cudnn"),
        ("megatron", 9.0, "_scaled_dot_product_flash_attention dropout 0.1", "cudnn"),
    ],
)
def test_the_runtimes_pick_the_kernels_their_sources_pick(runtime, cc, traced, want):
    assert attention_backend(runtime, cc, traced) == want


@pytest.mark.parametrize(
    "runtime, cc, traced, want",
    [
        # a torch of before cuDNN was preferred (fms-fsdp's of 2024: "SDPA ... Flash attention v2")
        ("eager", 9.0, "_scaled_dot_product_flash_attention", "flash2"),
        ("inductor", 10.0, "_scaled_dot_product_efficient_attention_backward_2", "efficient"),
        ("eager", 8.0, "_scaled_dot_product_flash_attention_backward", "flash2"),
        # TE with NVTE_FUSED_ATTN=0 (NeMo's launcher, 2024-02 to 2024-07): flash-attn on Hopper too
        ("megatron", 9.0, "_scaled_dot_product_flash_attention", "flash2"),
        ("megatron", 9.0, "_scaled_dot_product_flash_attention_backward", "flash2"),
        ("megatron", 8.0, "_scaled_dot_product_flash_attention", "flash2"),
    ],
)
def test_a_flash_first_torch_runs_the_kernel_traced(runtime, cc, traced, want):
    assert attention_backend(runtime, cc, traced, "flash-first") == want


# --- the latency model ------------------------------------------------------------------------


def _attention_gemm(seq: int, head_dim: int, phase: int, causal: bool = True, heads: int = 32) -> MatmulDesc:
    """``QKᵀ`` of one fused attention, cuDNN's, its boundary bytes only (inside a kernel)."""
    a = heads * seq * head_dim * 2
    return MatmulDesc(
        batch=heads, m=seq, n=seq, k=head_dim, a_elem=2, b_elem=2, c_elem=2, a_bytes=a, b_bytes=a,
        rhs_batched=True, onchip_bytes=heads * seq * seq * 2, causal=causal, launches=0,
        attention=phase, backend=at.BACKENDS.index("cudnn"),
    )  # fmt: skip


@pytest.mark.parametrize("phase", [1, 2])
@pytest.mark.parametrize("seq", [2048, 16384, 131072])
def test_an_attention_gemm_takes_its_computed_flops_at_its_kernels_rate(seq, phase):
    d = _attention_gemm(seq, 128, phase)
    frac = float(causal_fraction(seq, seq, 128))
    eff = at.efficiency(TABLE, "cudnn", at.PASSES[phase - 1], True, seq, 128, PEAK)
    assert estimate_op(d, H100).split_s == pytest.approx(d.flops * frac / (PEAK * eff), rel=1e-12)
    # not at the GEMMs' 0.70: slower than a large GEMM of the same FLOPs
    assert eff < H100.calibration.tensor_efficiency


def test_attention_time_grows_as_the_table_says():
    """From 8k to 64k tokens the computed FLOPs grow 64x; the time by 64x times the ratio of the
    rates (which level off): not as a GEMM's wave count would say."""
    t8 = estimate_op(_attention_gemm(8192, 128, 1), H100).split_s
    t64 = estimate_op(_attention_gemm(65536, 128, 1), H100).split_s
    r8 = at.tflops(TABLE, "cudnn", "fwd", True, 8192, 128)
    r64 = at.tflops(TABLE, "cudnn", "fwd", True, 65536, 128)
    frac = float(causal_fraction(65536, 65536, 128)) / float(causal_fraction(8192, 8192, 128))
    assert t64 / t8 == pytest.approx(64 * frac * r8 / r64, rel=1e-9)


def test_without_the_kernels_table_an_attention_gemm_is_priced_as_before():
    import dataclasses

    bare = dataclasses.replace(H100, calibration=dataclasses.replace(H100.calibration, attention_kernels=None))
    d = _attention_gemm(4096, 128, 1)
    plain = dataclasses.replace(d, attention=0, backend=0)
    assert estimate_op(d, bare).split_s == estimate_op(plain, bare).split_s == estimate_op(plain, H100).split_s
    # the table prices the whole kernel: compute-bound, no trips of the scores through the L2
    assert estimate_op(d, H100).bound == "compute"
    assert estimate_op(d, H100).split_s != estimate_op(plain, H100).split_s


# --- a long-sequence Llama: time, HFU and MFU -------------------------------------------------


@functools.cache
def _phazec(seq: int, kernels: str) -> dict:
    """tiny_llama_sdpa at ``seq`` tokens on one h100, its plan JSON (fp16 weights, 2 layers)."""
    import json
    import tempfile

    from phaze.tools.phazec import main

    out = Path(tempfile.mkdtemp()) / "plan.json"
    argv = [str(MODELS / "tiny_llama_sdpa.py"), "--hw", "h100", "--kernels", kernels, "--seq-len", str(seq)]
    argv += ["--micro-batch", "1", "--devices", "1", "--global-batch", "1", "--no-cache", "-q", "--json", str(out)]
    assert main(argv) == 0
    return json.loads(out.read_text())


@functools.cache
def _latency_module(seq: int, sdpa_order: str = "cudnn-first", kernels: str = "eager"):
    """tiny_llama_sdpa (head dim 16, GQA 2) at ``seq`` tokens, ``kernels`` (eager: torch's) under
    the attention backend order ``sdpa_order``, priced on the h100."""
    from phaze.tools.phazec import _parser, compile_model
    from phaze_ir.ir import parse_module

    args = _parser().parse_args(
        [str(MODELS / "tiny_llama_sdpa.py"), "--hw", "h100", "--emit", "latency", "--kernels", kernels]
        + ["--seq-len", str(seq), "--micro-batch", "1", "--tp", "1", "-q", "--no-cache", "--sdpa-order", sdpa_order]
    )
    with pytest.warns(Warning):  # beyond the tiny model's max_position_embeddings
        text, failure = compile_model(args, lambda msg: None)
    assert failure is None, failure
    return parse_module(text)


def _attention_gemms(module) -> list[tuple[str, float, float]]:
    """``(phase, computed FLOPs, split_s)`` of every GEMM of a fused attention kernel."""
    from passes.context_parallel import attention_kernels
    from phaze_ir import dialect as ph
    from phaze_ir import keys
    from phaze_ir.attributes import LatencyAttr

    out = []
    for ops in attention_kernels(module).values():
        for o in ops:
            if isinstance(o, ph.MatmulOp):
                _, m, n, k = o.mnk()
                computed = o.flops() * float(causal_fraction(m, n, k))
                lat = float(keys.require(o, keys.LATENCY, LatencyAttr).as_dict()["split_s"])
                out.append((keys.string_of(o, keys.PHASE, "fwd"), computed, lat))
    return out


def test_a_long_sequence_llamas_attention_time_grows_as_the_table_says():
    """Each fused attention GEMM of a Llama at 2k and at 8k tokens takes its computed FLOPs at
    cuDNN's rate for its pass at its sequence (head dim 16: held at the table's 64)."""
    totals = {}
    for seq in (2048, 8192):
        gemms = _attention_gemms(_latency_module(seq))
        assert len(gemms) == 2 * (2 + 5)  # 2 layers: the forward's 2 GEMMs, the backward's 5
        for phase, computed, seconds in gemms:
            eff = at.efficiency(TABLE, "cudnn", phase, True, seq, 16, PEAK)
            assert seconds == pytest.approx(computed / (PEAK * eff), rel=1e-9)
        totals[seq] = sum(s for _, _, s in gemms)
    # 16x the FLOPs (less the diagonal's share), at the faster rates of 8k
    assert 8 < totals[8192] / totals[2048] < 16


def test_under_a_flash_first_torch_the_attention_is_priced_at_flash_attention_2s_rate():
    """The same Llama at 4k tokens with --sdpa-order flash-first: each fused attention GEMM at
    FlashAttention-2's rate (the table's flash2), slower than cuDNN's; the module says the order,
    and the default leaves no trace of it."""
    from phaze_ir import keys

    flash, cudnn = _latency_module(4096, "flash-first"), _latency_module(4096)
    assert keys.string_of(flash, keys.SDPA_ORDER) == "flash-first" and keys.SDPA_ORDER not in cudnn.attributes
    for phase, computed, seconds in _attention_gemms(flash):
        eff = at.efficiency(TABLE, "flash2", phase, True, 4096, 16, PEAK)
        assert seconds == pytest.approx(computed / (PEAK * eff), rel=1e-9)
    assert sum(s for *_, s in _attention_gemms(flash)) > 1.2 * sum(s for *_, s in _attention_gemms(cudnn))


def test_transformer_engine_without_fused_attention_runs_flash_attention_2():
    """TE with NVTE_FUSED_ATTN=0 (--sdpa-order flash-first under --kernels megatron; NeMo's
    launcher of 2024-02 to 2024-07): each fused attention GEMM at FlashAttention-2's rate, where
    TE's default on an H100 runs cuDNN's."""
    flash, cudnn = _latency_module(4096, "flash-first", "megatron"), _latency_module(4096, "cudnn-first", "megatron")
    for module, kernel in ((flash, "flash2"), (cudnn, "cudnn")):
        for phase, computed, seconds in _attention_gemms(module):
            eff = at.efficiency(TABLE, kernel, phase, True, 4096, 16, PEAK)
            assert seconds == pytest.approx(computed / (PEAK * eff), rel=1e-9)


def test_a_ring_of_flash_attention_2_steps_takes_its_rates():
    """NeMo's 1M-token row as one device runs it (CP 32, TP 8: 32k queries a device, 4 heads of
    128): TE 1.4's AttnFuncWithCP runs every step with the kernel TE chose, so without cuDNN's
    fused attention the forward ring's 32 steps (one causal diagonal, 31 unmasked halves of the
    square) take FlashAttention-2's time: the table's rates at 16k, where they level off, about
    1.6x cuDNN's."""
    import dataclasses

    from passes.algorithms import context_parallel as cp
    from passes.algorithms.kernels import attention_backend

    s, d, heads, c = 32768, 128, 4, 32
    rings = {}
    for order in ("flash-first", "cudnn-first"):
        kernel = attention_backend("megatron", 9.0, "_scaled_dot_product_flash_attention", order)
        qk = dataclasses.replace(_attention_gemm(s, d, 1, heads=heads), backend=at.BACKENDS.index(str(kernel)))
        twin = cp.off_diagonal_gemm(qk)
        assert twin is not None
        steps = cp.forward_ring(estimate_op(qk, H100).split_s, estimate_op(twin, H100).split_s, 0.0, c)
        rings[kernel] = cp.ring_s(steps, 0.0)
    # FA3 paper, Figure 5, head dim 128 at 16k: causal 335 and 539, unmasked 370 and 595 TFLOP/s
    rates = {(k, m): at.tflops(TABLE, k, "fwd", m, s, d) for k in ("flash2", "cudnn") for m in (True, False)}
    assert rates == {("flash2", True): 335, ("flash2", False): 370, ("cudnn", True): 539, ("cudnn", False): 595}
    diagonal, off = float(causal_fraction(s, s, d)), 0.5  # the shares of the square a step computes
    want = (diagonal / 335 + (c - 1) * off / 370) / (diagonal / 539 + (c - 1) * off / 595)
    assert rings["flash2"] / rings["cudnn"] == pytest.approx(want, rel=1e-6)
    assert 1.55 < want < 1.65


def test_form_kernels_refuses_an_unknown_sdpa_order_in_one_line():
    from passes.form_kernels import FormKernelsPass
    from phaze_ir.errors import PhazeError

    with pytest.raises(PhazeError, match=r"^phaze-form-kernels: sdpa_order=math-first: expected one of cudnn-first"):
        FormKernelsPass(runtime="eager", sdpa_order="math-first").apply(None, None)  # type: ignore[arg-type]


def test_a_32k_token_plan_has_mfu_and_hfu_below_what_the_kernels_reach():
    plan = _phazec(32768, "megatron")
    s = plan["summary"]
    assert 0 < s["mfu_causal"] < 1 and 0 < s["hfu"] < 1
    assert s["hfu"] <= s["hfu_ceiling"] < 1
    # causal attention is most of the work at 32k: PaLM's MFU counts its whole square, above
    # HFU; the kernels compute about half of it, as the headline MFU counts it
    assert 0 < s["mfu_causal"] <= s["hfu"] < s["mfu_palm"]
    assert s["mfu_palm"] / s["mfu_causal"] > 1.5
    assert "PaLM" in s["mfu_palm_convention"] and "Megatron" in s["mfu_causal_convention"]
    assert not [w for w in s["warnings"] if "pricing error" in w]
    said = [line for line in s["lines"] if line.startswith("MFU convention: ")]
    assert len(said) == 1 and "Megatron" in said[0]
    assert f"MFU {plan_summary.percent(s['mfu_palm'])} with {plan_summary.MFU_PALM_CONVENTION}" in said[0]
