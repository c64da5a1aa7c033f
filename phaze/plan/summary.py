"""The plan summary a person reads: the same figures and lines on stderr, in a comment block at
the top of the plan file, in the JSON (``summary``) and in the report.

What it says, and from where (all from the compiled module and its plan JSON):

- the model (``phaze.model``, ``phaze.parameters``), the chip in words (its PE arrays, SRAM,
  HBM, area and power from its description), the devices and the placement;
- the time per batch and its parts (``breakdown_s``, which add up to it), samples/s and
  tokens/s;
- MFU (``mfu_causal``): the model FLOPs of a batch (``phaze.model_flops`` per traced
  micro-batch, times the micro-batches of the global batch: 6·N·tokens plus attention) with each
  causal attention counted as its kernel computes it, ``(s + 1)/2s`` of its s x s square
  (Megatron-LM's ``num_floating_point_operations``: "only half of the attention matrix is
  non-zero"; :data:`MFU_CONVENTION`) and a sliding-window one as its band
  (``phaze.window_skipped_flops`` off; :data:`MFU_WINDOW_CONVENTION`), over the time per batch
  times the devices used times the chip's peak tensor FLOP/s.  Time and HFU count the causal
  half and the band the same way, so MFU <= HFU.
  PaLM's convention, which counts a causal attention's whole square, is given beside it
  (``mfu_palm``, :data:`MFU_PALM_CONVENTION`): at long sequences it passes HFU;
- HFU: the FLOPs the devices run (each layer's forward and backward as sharded, as its kernels
  compute them: a causal attention's share of its square; its recomputed forward under full
  recompute, the attention core's share of it under selective recompute, the optimizer's)
  over the same; never above the best rate the chip's kernels reach (``hfu_ceiling``: its
  GEMMs' ``tensor_efficiency``, its attention kernels' best published rate): a plan beyond it,
  or with MFU or HFU at 100 % or more, carries a warning (a pricing error);
- the memory per device of the fullest stage, by part, against HBM (and the usable part of HBM
  under ``--memory-headroom``);
- the runner-up point of the sweep (micro-batch, TP width) and by how much it lost;
- the plan's warnings (unpriced ops, linears tensor parallelism keeps replicated);
- the error band of the plan's regime (chip, FSDP or Megatron-style, precision, sequence, CP,
  compile, MoE): how far phaze has been from the published runs of that regime
  (:mod:`phaze.plan.error_bands`, ``data/published/error_bands.json``), or that none was published.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from phaze.plan import error_bands
from phaze_ir import keys
from phaze_ir.files import printable
from phaze_ir.op_kinds import RecomputePolicy

#: Names of the breakdown's parts in the summary's lines.
PART_NAMES = {
    "compute_s": "compute",
    "tp_comm_s": "TP comm",
    "recompute_s": "recompute",
    "pp_comm_s": "PP comm",
    "ep_comm_s": "EP comm",
    "bubble_s": "bubble",
    "dp_comm_s": "DP comm",
    "optimizer_s": "optimizer",
    "power_limit_s": "power limit",
}

_PREFIXES = ((1e24, "Y"), (1e21, "Z"), (1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(value: float, unit: str, digits: int = 3) -> str:
    """``value`` with an SI prefix and ``digits`` significant digits: ``si(85.9e9, "B")`` is
    ``85.9 GB``."""
    for scale, prefix in _PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}"


_BINARY = ((2**50, "PiB"), (2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def binary_bytes(value: float, digits: int = 3) -> str:
    """Bytes of memory as a person reads them everywhere (CLI, summary, report): binary
    prefixes, ``binary_bytes(85.9e9)`` is ``80 GiB``; the JSON keeps the exact bytes.  Rates
    (``GB/s``) and FLOP counts stay SI, as the datasheets give them."""
    for scale, unit in _BINARY:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {unit}"
    return f"{value:.{digits}g} B"


def percent(fraction: float) -> str:
    """A fraction as a percentage of three significant digits (``41.2%``, ``0.00235%``)."""
    return f"{fraction * 100:.3g}%"


def count_words(n: int) -> str:
    """A count in words: ``1.56 billion``, ``350 million``, ``133,440``."""
    for scale, word in ((1e12, "trillion"), (1e9, "billion"), (1e6, "million")):
        if n >= scale:
            return f"{n / scale:.3g} {word}"
    return f"{n:,}"


def chip_words(acc: Mapping[str, Any]) -> str:
    """The chip of a plan JSON's ``accelerator`` in words: its PE arrays, SRAM, HBM, area and
    power."""
    tc, vc = acc["tensor_cores"], acc["vector_cores"]
    sram = tc["count"] * tc["buffer_bytes"] + vc["count"] * vc["buffer_bytes"] + acc["global_buffer"]["bytes"]
    parts = [
        f"{tc['count']} tensor cores of {tc['pe_x']}x{tc['pe_y']} PEs"
        + (f" (FP8 at {tc['fp8_rate']}x)" if tc.get("fp8_rate") else ""),
        f"{vc['count']} vector cores of {vc['width']} lanes",
        f"{binary_bytes(sram)} SRAM ({binary_bytes(acc['global_buffer']['bytes'])} global buffer)",
        f"{binary_bytes(acc['hbm']['bytes'])} HBM at {si(acc['hbm']['bandwidth_Bps'], 'B/s')}",
        f"{si(acc['clock_hz'], 'Hz')}",
    ]
    if acc.get("area_mm2") is not None:
        parts.append(f"{acc['area_mm2']:.4g} mm²")
    if acc.get("power_w") is not None:
        parts.append(f"{acc['power_w']:.4g} W")
    return f"{acc['name']}: " + ", ".join(parts)


def placement_words(plan: Mapping[str, Any]) -> str:
    """The plan's placement in the flags' words."""
    v = int(plan["virtual_stages"])
    schedule = "1F1B" if v == 1 else f"interleaved 1F1B ({v} chunks per device)"
    recompute = ", ".join(sorted({str(s["recompute"]) for s in plan["stages"]}))
    words = [
        f"DP {plan['dp']} x "
        + (f"CP {plan['cp']} x " if int(plan.get("cp", 1)) > 1 else "")
        + f"PP {plan['pp']} x TP {plan['tp']}",
        f"sequence parallel {'on' if plan['sequence_parallel'] else 'off'}",
        f"ZeRO {plan['zero']}",
        schedule,
    ]
    if plan.get("dp_shard"):
        replicas = int(plan["dp"]) * int(plan.get("cp", 1)) // int(plan["dp_shard"])
        words.insert(3, f"HSDP (sharded over {plan['dp_shard']}, {replicas} replicas)")
    if int(plan["expert_parallel"]) > 1:
        words.append(f"EP {plan['expert_parallel']}")
    if int(plan.get("expert_tensor_parallel") or plan["tp"]) != int(plan["tp"]):
        words.append(f"expert TP {plan['expert_tensor_parallel']} (experts folded over TP x CP x DP)")
    words += [
        f"micro-batch {plan['micro_batch_size']} x {plan['num_micro_batches']}",
        f"recompute {recompute}",
        f"ranks {plan['rank_order']}",
    ]
    return f"{plan['devices_used']} of {plan['devices']} devices: " + ", ".join(words)


#: How the summary's MFU (``mfu_causal``, the headline) counts attention (said beside the figure,
#: and in the JSON).
MFU_CONVENTION = "6·N per token plus attention as computed, causal attention half its square (Megatron-LM's)"
#: The same, said of a step with sliding-window attention (``phaze.window_skipped_flops``).
MFU_WINDOW_CONVENTION = MFU_CONVENTION + ", a sliding window's band as its kernel computes it"
#: How ``mfu_palm`` counts it.
MFU_PALM_CONVENTION = "6·N per token plus causal attention's whole s² square (PaLM's)"


def causal_attention_skipped(module, plan: Mapping[str, Any]) -> float:
    """The model FLOPs of a batch that a causal attention kernel does not compute: of the
    convention's whole s x s square of every causal fused attention
    (``phaze.causal_attention_flops``, the importer's: three times its forward GEMMs, of the
    unsharded step as traced; c² times under CP of degree c, as
    :func:`phaze_ir.keys.sample_model_flops` counts them), the ``(s - 1)/2s`` above the
    diagonal, s the whole sequence; and all a sliding-window kernel skips
    (``phaze.window_skipped_flops``).  Read from the module's attributes alone (a plan template's
    skeleton has no step body)."""
    from passes.algorithms.latency import causal_fraction

    causal = keys.int_of(module, keys.CAUSAL_ATTENTION_FLOPS, 0)
    window = keys.int_of(module, keys.WINDOW_SKIPPED_FLOPS, 0)
    seq = keys.sample_seq_len(module)
    if not (causal or window) or not seq:
        return 0.0
    cp = keys.int_of(module, keys.CONTEXT_PARALLEL, 1)
    traced_b = keys.int_of(module, keys.MICRO_BATCH_SIZE, 1)
    batches = int(plan["global_batch"]) / traced_b
    # sliding-window attentions: what their kernels skip, counted by the importer (not under CP)
    skipped = float(window) * batches if window else 0.0
    if not causal:
        return skipped
    per_batch = float(causal * cp * cp) / traced_b * int(plan["global_batch"])
    return per_batch * (1.0 - float(causal_fraction(seq, seq, seq))) + skipped


def kernel_ceiling(acc, module) -> float:
    """The best fraction of the tensor peak the chip's kernels reach, which HFU cannot pass:
    its GEMMs' ``tensor_efficiency`` (at the FP8 peak when the step has FP8 GEMMs) or its best
    attention kernel's published rate; 1 on a chip without a calibration, or its FP8
    datapath's rate (``tensor_cores.fp8_rate``) when the step has FP8 GEMMs."""
    cal = acc.calibration
    if cal is None:
        fp8 = acc.tensor_cores.fp8_rate
        return float(fp8) if fp8 and _has_fp8_gemms(module) else 1.0
    best = cal.tensor_efficiency
    if cal.fp8_gemm_flops is not None and _has_fp8_gemms(module):
        best *= cal.fp8_gemm_flops / acc.peak_tensor_flops
    if cal.attention_kernels is not None:
        from passes.algorithms import attention

        best = max(best, attention.load(cal.attention_kernels).best_tflops() * 1e12 / acc.peak_tensor_flops)
    return best


def _has_fp8_gemms(module) -> bool:
    from passes.graph_view import step_function
    from phaze_ir import dialect as ph

    return any(
        isinstance(o, ph.MatmulOp) and ph.element_bytes(ph.tensor_type(o.lhs).element_type) == 1
        for o in step_function(module).body.block.ops
    )


def utilisation_warnings(mfu: float | None, hfu: float | None, ceiling: float) -> list[str]:
    """What cannot be: MFU or HFU at 100 % or more, MFU above HFU (the model FLOPs, causal
    attention as computed, are a part of what the devices run), HFU above what the chip's kernels
    reach."""
    out = []
    for name, value in (("MFU", mfu), ("HFU", hfu)):
        if value is not None and value >= 1.0:
            out.append(f"{name} {percent(value)} is not possible (at least 100 % of the peak): a pricing error")
    if mfu is not None and hfu is not None and mfu > hfu * (1 + 1e-9):
        out.append(f"MFU {percent(mfu)} is above HFU {percent(hfu)}: model FLOPs not run, a pricing error")
    if hfu is not None and hfu < 1.0 and hfu > ceiling * (1 + 1e-9):
        out.append(
            f"HFU {percent(hfu)} is above the {percent(ceiling)} of the peak the chip's fastest kernels reach: "
            "a pricing error"
        )
    return out


def workspace_words(module, stage: Mapping[str, Any]) -> str:
    """What the workspace of ``stage`` (the plan JSON's fullest stage) holds, in words: the
    placement counts a stage's workspace as the largest transient set of one of its layers
    (:func:`passes.algorithms.memory.stage_bytes`): the larger of its forward's and backward's
    peaks, or its backward with its forward's activations re-run under recompute (what the
    re-run adds is said); this names the layer (the head: logits and loss; the prologue:
    embeddings; a block by its module).  ""
    when the layers' records do not give the stage's number (nothing guessed)."""
    from phaze_ir.attributes import LayerInfoAttr, LayerMemoryAttr

    records = keys.records_of(module, keys.LAYER_MEMORY, LayerMemoryAttr)
    memory = {int(r.as_dict()["index"]): r.as_dict() for r in records}
    layers = {int(r.as_dict()["index"]): r.as_dict() for r in keys.records_of(module, keys.LAYERS, LayerInfoAttr)}
    first, last = (int(x) for x in stage["layers"])
    policy = str(stage["recompute"])
    recomputed = policy != RecomputePolicy.NONE

    def workspace(m: Mapping[str, Any]) -> int:
        return int(m["recompute_workspace_bytes"] if recomputed else m["workspace_bytes"])

    held = [i for i in range(first, last + 1) if i in memory and i in layers]
    if not held:
        return ""
    k = max(held, key=lambda i: (workspace(memory[i]), -i))
    m, total = memory[k], workspace(memory[k])
    if total != int(stage["memory"]["workspace"]) or total <= 0:
        return ""
    kind = str(layers[k]["kind"])
    name = {"head": "the head (logits and loss)", "prologue": "the prologue (embeddings)"}.get(
        kind, f"block {k} ({printable(str(layers[k]['module']))})"
    )
    plain = int(m["workspace_bytes"])  # the larger of its forward's and its backward's peaks
    if recomputed and total > plain:
        part = f"its backward with its forward's activations re-run ({binary_bytes(total - plain)} of it)"
    else:
        part = "its forward's or its backward's peak"
    return f"workspace {binary_bytes(total)}: the largest transient set of one layer of the stage, {name}, {part}"


def hardware_flops(module, plan: Mapping[str, Any]) -> float:
    """The FLOPs all devices run in one batch: each stage's layers (forward, backward and
    recomputed forward, as sharded over TP and as the ops run: ``phaze.layer_flops`` of the
    compiled module) times the
    micro-batches, times the DP replicas and TP ranks that run it; plus the optimizer step (on
    every DP replica, or shared among them under ZeRO).  Selective recompute re-runs the
    attention core: its FLOPs are taken as the forward's times the share of the forward's
    time it takes (``phaze.layer_recompute``'s ``selective_s / full_s``)."""
    from phaze_ir.attributes import LayerFlopsAttr, LayerRecomputeAttr

    layers = {int(r.as_dict()["index"]): r.as_dict() for r in keys.records_of(module, keys.LAYER_FLOPS, LayerFlopsAttr)}
    recompute = {
        int(r.as_dict()["index"]): r.as_dict()
        for r in keys.records_of(module, keys.LAYER_RECOMPUTE, LayerRecomputeAttr)
    }
    # Under context parallelism each of a replica's cp devices runs the layers on its share
    # of the tokens, and the ZeRO state is shared over the dp·cp devices of the DP×CP group.
    cp = int(plan.get("cp", 1))
    dp, tp, m = int(plan["dp"]) * cp, int(plan["tp"]), int(plan["num_micro_batches"])
    total = 0.0
    for stage in plan["stages"]:
        first, last = stage["layers"]
        for i in range(int(first), int(last) + 1):
            layer = layers.get(i)
            if layer is None:
                continue
            fwd = float(layer["fwd_flops"])
            again = 0.0
            if stage["recompute"] == RecomputePolicy.FULL:
                again = fwd
            elif (
                stage["recompute"] == RecomputePolicy.SELECTIVE and i in recompute and float(recompute[i]["full_s"]) > 0
            ):
                again = fwd * float(recompute[i]["selective_s"]) / float(recompute[i]["full_s"])
            total += m * dp * tp * (fwd + float(layer["bwd_flops"]) + again)
            total += tp * (1 if int(plan["zero"]) >= 1 else dp) * float(layer["opt_flops"])
    return total


def runner_up(candidates: Sequence[Mapping[str, Any]], best: float) -> dict[str, Any] | None:
    """The sweep's fastest point after the plan's (``candidates``: the plan JSON's), and how much
    it lost by; None when no other point fits."""
    fitting = sorted(
        (c for c in candidates if c["throughput_samples_per_s"] > 0), key=lambda c: -c["throughput_samples_per_s"]
    )
    if len(fitting) < 2 or best <= 0:
        return None
    c = fitting[1]
    sp = ", sequence parallel" if c["sequence_parallel"] else ""
    cp = f", CP {c['cp']}" if int(c.get("cp", 1)) > 1 else ""
    name = f"micro-batch {c['micro_batch_size']}, TP {c['tp']}{sp}{cp}"
    lost = 1 - c["throughput_samples_per_s"] / best
    return {
        "name": name,
        "samples_per_s": c["throughput_samples_per_s"],
        "slower_by": lost,
        "why": f"{lost:.1%} fewer samples/s ({c['throughput_samples_per_s']:.5g} against {best:.5g})",
    }


def search_runner_up(baselines: Sequence[Mapping[str, Any]], plan: Mapping[str, Any]) -> dict[str, Any] | None:
    """The architecture search's runner-up: its fastest baseline that is not the winning chip
    and placement (the co-optimised baseline often is), and what it lost by and on: its chip's
    area and HBM, its placement; None without one."""
    best = float(plan["throughput_samples_per_s"])
    won = ((plan["accelerator"] or {}).get("name"), plan["dp"], plan["pp"], plan["tp"], plan["micro_batch_size"])
    others = [
        b
        for b in baselines
        if b["throughput_samples_per_s"] > 0
        and ((b["accelerator"] or {}).get("name"), b["dp"], b["pp"], b["tp"], b["micro_batch_size"]) != won
    ]
    if not others or best <= 0:
        return None
    b = max(others, key=lambda b: b["throughput_samples_per_s"])
    lost = 1 - b["throughput_samples_per_s"] / best
    chip = (b["accelerator"] or {}).get("name", "")
    area = f", {b['area_mm2']:.4g} mm²" if b.get("area_mm2") else ""
    hbm = f", {binary_bytes(b['hbm_bytes'])} HBM" if b.get("hbm_bytes") else ""
    on = f"{chip}{area}{hbm}; DP {b['dp']} x PP {b['pp']} x TP {b['tp']}, micro-batch {b['micro_batch_size']}"
    return {
        "name": f"baseline {b['name']}",
        "samples_per_s": b["throughput_samples_per_s"],
        "slower_by": lost,
        "why": f"{lost:.1%} fewer samples/s ({b['throughput_samples_per_s']:.5g} against {best:.5g}) on {on}",
    }


def with_runner_up(summary: dict[str, Any], runner: Mapping[str, Any] | None) -> dict[str, Any]:
    """``summary`` with its runner-up replaced by ``runner`` (its line too)."""
    out = dict(summary)
    out["runner_up"] = runner
    kept = [line for line in summary["lines"] if not line.startswith("runner-up ")]
    if runner is not None:
        at = next((i + 1 for i, line in enumerate(kept) if line.startswith("memory per device ")), len(kept))
        kept.insert(at, f"runner-up {runner['name']}: {runner['why']}")
    out["lines"] = kept
    return out


def warning_words(warnings: Sequence[Mapping[str, Any]]) -> list[str]:
    """The plan JSON's ``warnings`` as sentences."""
    out = []
    for w in warnings:
        if w.get("kind") == "unpriced-op":
            out.append(f"{w.get('aten')} ({w.get('count')}x) is not priced but by its bytes")
        elif w.get("kind") == "replicated-linears":
            out.append(replicated_words(w))
        else:
            out.append(_fields(w))
    return out


#: What a ``replicated-linears`` record's ``reason`` says.
REPLICATED_REASONS = {
    "kv_heads": "fewer key/value heads than devices",
    "demoted": "an op between them cannot take the split",
    "outside_blocks": "outside the repeated blocks",
    "weights": "no rule recognized them as a linear's weights",
}


def replicated_words(w: Mapping[str, Any]) -> str:
    """A ``replicated-linears`` record in one line: what TP keeps whole, the first of them, and
    their share of the parameters and of the linear FLOPs."""
    what = "weight matrices of the blocks" if w.get("reason") == "weights" else "linears"
    shares = f"{percent(float(w.get('param_share', 0.0)))} of the parameters"
    if w.get("flops_share"):
        shares += f", {percent(float(w['flops_share']))} of the linear FLOPs"
    return (
        f"TP {w.get('width')} keeps {w.get('count')} of {w.get('total')} {what} whole "
        f"({REPLICATED_REASONS.get(str(w.get('reason')), w.get('reason'))}; first {w.get('module')}): {shares}"
    )


def _fields(w: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in w.items() if k != "kind")


def build(
    module, plan: Mapping[str, Any], table: str, other_lines: Sequence[str], headroom: float = 0.0
) -> dict[str, Any] | None:
    """The summary of a plan JSON (``plan``, without its ``summary``) of a compiled ``module``;
    ``table``: the one-row placement table, ``other_lines``: the power and cost lines (empty
    when not priced); None when the plan does not fit."""
    from phaze_ir.hardware_ir import module_accelerator

    if not plan["feasible"] or not plan["stages"]:
        return None
    acc = module_accelerator(module, "phazec")
    time_s = float(plan["time_per_batch_s"])
    samples_s = float(plan["throughput_samples_per_s"])
    seq = keys.sample_seq_len(module)
    traced_b = keys.int_of(module, keys.MICRO_BATCH_SIZE, 1)
    per_micro_batch = keys.sample_model_flops(module)
    peak = acc.peak_tensor_flops * int(plan["devices_used"]) * time_s
    palm_flops = per_micro_batch / traced_b * int(plan["global_batch"]) if per_micro_batch else None
    model_flops = palm_flops - causal_attention_skipped(module, plan) if palm_flops is not None else None
    hw_flops = hardware_flops(module, plan)
    mfu = model_flops / peak if model_flops is not None and peak > 0 else None
    mfu_palm = palm_flops / peak if palm_flops is not None and peak > 0 else None
    hfu = hw_flops / peak if peak > 0 else None
    ceiling = kernel_ceiling(acc, module)
    worst = max(plan["stages"], key=lambda s: s["memory_bytes"])
    hbm = int(plan["accelerator"]["hbm_bytes"])
    out: dict[str, Any] = {
        "model": plan["model"],
        "parameters": keys.int_of(module, keys.PARAMETERS, 0) or None,
        "chip": chip_words(plan["accelerator"]),
        "placement": placement_words(plan),
        "time_per_batch_s": time_s,
        "breakdown_s": dict(plan["breakdown_s"] or {}),
        "samples_per_s": samples_s,
        "tokens_per_s": samples_s * seq if seq else None,
        # the headline MFU and its model FLOPs count causal attention as computed; "mfu" and
        # "model_flops_per_batch", which counted PaLM's whole square, are now the "_palm" keys
        "model_flops_causal_per_batch": model_flops,
        "model_flops_palm_per_batch": palm_flops,
        "hardware_flops_per_batch": hw_flops,
        "peak_flops_per_s": acc.peak_tensor_flops,
        "mfu_causal": mfu,
        "mfu_causal_convention": MFU_WINDOW_CONVENTION
        if keys.int_of(module, keys.WINDOW_SKIPPED_FLOPS, 0)
        else MFU_CONVENTION,
        "mfu_palm": mfu_palm,
        "mfu_palm_convention": MFU_PALM_CONVENTION,
        "hfu": hfu,
        "hfu_ceiling": ceiling,
        "memory_bytes": dict(worst["memory"]),
        "workspace": workspace_words(module, worst),
        "max_memory_bytes": int(worst["memory_bytes"]),
        "hbm_bytes": hbm,
        "memory_headroom": headroom,
        "runner_up": runner_up(plan["candidates"], samples_s),
        "warnings": warning_words(plan["warnings"]) + utilisation_warnings(mfu, hfu, ceiling),
        "error_band": error_bands.band(error_bands.plan_regime(module, plan), error_bands.table()),
    }
    # each line safe to print (a model or chip name from the input may hold control characters)
    out["lines"] = [printable(line) for line in lines(out, table, other_lines)]
    return out


def lines(s: Mapping[str, Any], table: str, other_lines: Sequence[str]) -> list[str]:
    """The summary as the lines a person reads (stderr, the plan file's comment, the report)."""
    params = f", {count_words(s['parameters'])} parameters" if s["parameters"] else ""
    out = [f"model {s['model']}{params}", f"chip {s['chip']}", f"placement {s['placement']}", *table.splitlines()]
    time_s, parts = s["time_per_batch_s"], s["breakdown_s"]
    shown = [f"{PART_NAMES[p]} {v:.4g} ({v / time_s:.1%})" for p, v in parts.items() if v > 0 and time_s > 0]
    out.append(f"time per batch {time_s:.4g} s = " + (" + ".join(shown) if shown else "0"))
    rate = f"{s['samples_per_s']:.5g} samples/s"
    if s["tokens_per_s"] is not None:
        rate += f", {s['tokens_per_s']:,.0f} tokens/s"
    use = []
    mfu, palm = s.get("mfu_causal"), s.get("mfu_palm")
    if mfu is not None:
        use.append(f"MFU {percent(mfu)}")
    if s["hfu"] is not None:
        use.append(f"HFU {percent(s['hfu'])}")
    if use:
        rate += "; " + ", ".join(use) + f" of the chips' {si(s['peak_flops_per_s'], 'FLOP/s')} tensor peak"
    out.append(rate)
    if mfu is not None:
        line = f"MFU convention: {s.get('mfu_causal_convention', MFU_CONVENTION)}"
        if palm is not None and abs(palm - mfu) > 1e-12:
            line += f"; MFU {percent(palm)} with {s.get('mfu_palm_convention', MFU_PALM_CONVENTION)}"
        if s.get("hfu_ceiling") is not None:
            line += f"; HFU at most {percent(s['hfu_ceiling'])} (the chip's fastest kernels)"
        out.append(line)
    by_part = " + ".join(f"{part} {binary_bytes(v)}" for part, v in s["memory_bytes"].items() if v > 0)
    usable = ""
    if s["memory_headroom"] > 0:
        fill = binary_bytes(s["hbm_bytes"] * (1 - s["memory_headroom"]))
        usable = f" ({fill} usable: {s['memory_headroom']:.0%} headroom)"
    used, hbm = binary_bytes(s["max_memory_bytes"]), binary_bytes(s["hbm_bytes"])
    out.append(f"memory per device {used} of {hbm} HBM{usable} = {by_part}")
    if s.get("workspace"):
        out.append(s["workspace"])
    if s["runner_up"] is not None:
        out.append(f"runner-up {s['runner_up']['name']}: {s['runner_up']['why']}")
    out += [f"warning: {w}" for w in s["warnings"]]
    out += list(other_lines)
    if s.get("error_band"):
        out.append(error_bands.line(s["error_band"]))
    return out


def comment(summary: Mapping[str, Any] | None) -> str:
    """The summary as an MLIR comment block (``//`` lines) to put before the plan's module."""
    if not summary:
        return ""
    return "".join(f"// {line}".rstrip() + "\n" for line in ["phaze plan", *summary["lines"]]) + "\n"
