"""``phazec --export``: a plan as Megatron-LM and torchtitan arguments, loaded by the real consumers.

torchtitan: the exported arguments go through torchtitan 0.3.0's own ``ConfigManager`` (which
rejects an unknown flag and checks combinations), its ``ParallelDims`` (the degrees multiply to
the plan's devices) and its pipeline split functions (each chunk gets the plan's blocks).

Megatron-LM: its training package (``megatron/training/arguments.py``) is not on PyPI, so every
flag is checked against Megatron-LM's own parser as recorded in
``tests/data/megatron_training_flags.txt`` (name, action, type, choices; made by
``tests/data/megatron_training_flags.py`` from a Megatron-LM checkout, whose ``--check`` also runs
Megatron-LM's ``validate_args`` on export files), then mapped to megatron-core 0.16.1's config
dataclasses, built on CPU so that megatron-core validates the combination, as
``core_transformer_config_from_args`` does.

Both consumers are installed by ``.ci/run`` (torchtitan with ``--no-deps``); without them those
checks are skipped and say so.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import MODELS, run_main

from phaze.plan.export import (
    MEGATRON_FLAGS,
    TRACED_ATTENTION_KEY,
    Launchable,
    ModelFacts,
    launchable_choices,
    megatron_args,
    megatron_attention_backend,
    megatron_layout,
    megatron_model_args,
    precision,
    refusals,
    settings,
    torchtitan_args,
    torchtitan_flavour,
    torchtitan_flavour_file,
    torchtitan_split,
    torchtitan_stage_blocks,
)
from phaze_ir.errors import PhazeError

DATA = Path(__file__).resolve().parent / "data"

# megatron-core warns about settings of the models the test makes up (no TE, MoE sizes): not ours.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning:megatron")


#: A Llama-like shape (``phaze.model_shape``) whose heads and query groups every TP width of the
#: cases divides: grouped-query attention, SwiGLU, RMSNorm, RoPE, untied, no biases.
SHAPE = {
    "hidden_size": 128,
    "num_attention_heads": 8,
    "num_query_groups": 4,
    "ffn_hidden_size": 352,
    "activation": "swiglu",
    "normalization": "RMSNorm",
    "norm_epsilon": 1e-05,
    "position_embedding": "rope",
    "rotary_base": 500000,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "tied_embeddings": False,
    "linear_bias": False,
    "qkv_bias": False,
    "attention_dropout": 0.0,
    "hidden_dropout": 0.0,
}
#: tests/models/tiny_gpt2.py's shape as phaze_ir.frontend.shape reads it.
TINY_GPT2_SHAPE = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "norm_epsilon": 1e-05,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "activation": "gelu_new",
    "normalization": "LayerNorm",
    "position_embedding": "learned_absolute",
    "tied_embeddings": True,
    "linear_bias": True,
    "qkv_bias": True,
    "ffn_hidden_size": 256,
    "attention_dropout": 0.1,
    "hidden_dropout": 0.1,
}


def facts(blocks: int, **kw) -> ModelFacts:
    kinds = ("prologue",) + ("block",) * blocks + ("head",)
    return ModelFacts(layer_kinds=kinds, seq_len=kw.pop("seq_len", 1024), shape=kw.pop("shape", SHAPE), **kw)


def plan(
    chunks: list[int],
    dp: int = 2,
    pp: int = 2,
    tp: int = 2,
    b: int = 2,
    m: int = 4,
    recompute: str | list[str] = "none",
    **extra,
) -> dict:
    """A plan dict as ``plan_json`` writes it, with ``chunks`` blocks per pipeline chunk (prologue
    on the first, head on the last)."""
    stages, first = [], 0
    for i, n in enumerate(chunks):
        last = first + n + (1 if i == 0 else 0) + (1 if i == len(chunks) - 1 else 0) - 1
        policy = recompute[i] if isinstance(recompute, list) else recompute
        stages.append({"rank": i % pp, "layers": [first, last], "recompute": policy})
        first = last + 1
    return {
        "feasible": True,
        "binding": "",
        "dp": dp,
        "pp": pp,
        "tp": tp,
        "micro_batch_size": b,
        "num_micro_batches": m,
        "global_batch": dp * b * m,
        "devices_used": dp * pp * tp * extra.get("cp", 1),
        "cp": 1,
        "sequence_parallel": False,
        "virtual_stages": 1,
        "zero": 0,
        "expert_parallel": 1,
        "rank_order": "tp-dp-pp",
        "pipeline_transfer": "whole",
        "stages": stages,
        **extra,
    }


# --- the consumers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def titan():
    pytest.importorskip("torchtitan.config", reason="torchtitan 0.3.0 is installed by .ci/run (--no-deps)")
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import pipeline_parallel
    from torchtitan.distributed.parallel_dims import ParallelDims

    logging.getLogger("torchtitan").setLevel(logging.ERROR)
    return SimpleNamespace(ConfigManager=ConfigManager, pp=pipeline_parallel, ParallelDims=ParallelDims)


@pytest.fixture(scope="module")
def mcore():
    pytest.importorskip("megatron.core", reason="megatron-core 0.16.1 is in the dev extra")
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.parallel_state import RankGenerator
    from megatron.core.transformer import TransformerConfig

    return SimpleNamespace(
        torch=torch, TC=TransformerConfig, DDP=DistributedDataParallelConfig, Opt=OptimizerConfig, Ranks=RankGenerator
    )


def titan_load(titan, lines: list[str], f: ModelFacts, flavour_dir: Path | None = None):
    """torchtitan's ConfigManager on the lines as written (nothing prepended), the flavour file
    they name (:func:`torchtitan_flavour_file`, in ``flavour_dir`` or written to a temporary
    one) importable as torchtitan's launcher imports it (its directory on ``sys.path``); and
    torchtitan's model builder on the config's model (on the meta device)."""
    import sys
    import tempfile

    import torch

    module = next(line.split("=", 1)[1] for line in lines if line.startswith("--module="))
    with tempfile.TemporaryDirectory() as tmp:
        where = flavour_dir or Path(tmp)
        if module != "llama3" and flavour_dir is None:
            (where / f"{module}.py").write_text(torchtitan_flavour_file(f, module))
        sys.path.insert(0, str(where))
        sys.modules.pop(module, None)  # another case's flavour of the same name
        try:
            c = titan.ConfigManager().parse_args(lines)
        finally:
            sys.path.remove(str(where))
            sys.modules.pop(module, None)
    with torch.device("meta"):
        model = c.model_spec.model.build()
    return c, model


def titan_check(titan, lines: list[str], p: dict, f: ModelFacts, flavour_dir: Path | None = None) -> None:
    """Parse with torchtitan (nothing prepended), build its model, and compare every field phaze
    sets with the plan."""
    s = settings(p, f, "torchtitan")
    c, model = titan_load(titan, lines, f, flavour_dir)
    # The model built is the traced one (torchtitan's Llama 3 of its shape).
    shape = f.shape
    assert len(model.layers) == f.num_blocks
    assert model.tok_embeddings.weight.shape == (shape["vocab_size"], shape["hidden_size"])
    wqkv = next(mod for name, mod in model.named_modules() if name.endswith("attention.qkv_linear.wqkv"))
    heads, groups = shape["num_attention_heads"], shape.get("num_query_groups", shape["num_attention_heads"])
    head = shape["hidden_size"] // heads
    assert wqkv.weight.shape == ((heads + 2 * groups) * head, shape["hidden_size"])
    w1 = next(mod for name, mod in model.named_modules() if name.endswith("feed_forward.w1"))
    assert w1.weight.shape[0] == shape["ffn_hidden_size"]
    assert c.compile.enable == (f.kernels == "inductor")
    assert c.compile.enable_async_tensor_parallel == s.tp_overlap
    par, tr = c.parallelism, c.training
    replicate, shard = (1, s.dp) if s.zero == 3 else (s.dp, 1)
    if f.dp_shard and s.zero == 3 and f.dp_shard < s.dp * s.cp:  # HSDP: FSDP over dp_shard x cp, replicas the rest
        shard = f.dp_shard // s.cp
        replicate = s.dp // shard
    assert (par.data_parallel_replicate_degree, par.data_parallel_shard_degree) == (replicate, shard)
    assert (par.tensor_parallel_degree, par.pipeline_parallel_degree) == (s.tp, s.pp)
    assert (par.context_parallel_degree, par.expert_parallel_degree) == (s.cp, s.expert_parallel)
    assert par.enable_sequence_parallel == (s.sequence_parallel and s.tp > 1)
    assert tr.global_batch_size == s.global_batch and tr.seq_len == f.seq_len
    assert tr.mixed_precision_param == ("float32" if precision(f) == "fp32" else "bfloat16")
    dims = titan.ParallelDims.from_config(par, world_size=s.devices_used)  # degrees x = world size
    assert dims.pp == s.pp and dims.tp == s.tp and dims.cp == s.cp
    if s.cp > 1:  # torchtitan shards the weights over data_parallel_shard x cp: phaze's ZeRO-3 over DP x CP
        assert s.zero == 3 and dims.fsdp_enabled and dims.dp_shard * dims.cp == s.dp * s.cp
    if s.pp > 1:
        assert par.pipeline_parallel_schedule == ("Interleaved1F1B" if s.virtual_stages > 1 else "1F1B")
        assert par.pipeline_parallel_microbatch_size == s.micro_batch
        assert tr.local_batch_size == s.micro_batch * s.num_micro_batches
        # torchtitan's own split: as many stages as the plan's chunks, each with its blocks.
        model = SimpleNamespace(layers=[None] * f.num_blocks)
        stages, layers, inw, outw = titan.pp._get_pipeline_metadata(dims, par, model)
        assert stages == s.pp * s.virtual_stages
        parts = titan.pp._generate_llm_fqn_per_model_part(stages, layers, inw, outw)
        assert [sum(n.startswith("layers.") for n in part) for part in parts] == list(s.chunk_blocks)
        assert "tok_embeddings" in parts[0] and "lm_head" in parts[-1]
    else:
        assert tr.local_batch_size == s.micro_batch  # the rest by gradient accumulation
        assert tr.global_batch_size == s.micro_batch * s.num_micro_batches * s.dp
    ac = type(c.activation_checkpoint).__qualname__
    selective_op = s.recompute == "selective" and f.selective_recompute == "op"
    assert ac == ("FullAC.Config" if s.recompute == "full" else "SelectiveAC.Config" if selective_op else "NoneType")


def megatron_flag_table() -> dict[str, tuple[str, str, dict[str, str]]]:
    rows = {}
    for line in (DATA / "megatron_training_flags.txt").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        flag, dest, action, *rest = line.split()
        rows[flag] = (dest, action, dict(r.split("=", 1) for r in rest))
    return rows


#: Megatron-LM flags that are no field of megatron-core's config dataclasses (checked apart).
MEGATRON_TRAINING_ONLY = {
    "micro_batch_size",
    "global_batch_size",
    "seq_length",
    "num_virtual_stages_per_pipeline_rank",
    "ckpt_format",
    "use_tp_pp_dp_mapping",
    # the model's: GPTModel's arguments, the tokenizer's, or mapped below as
    # core_transformer_config_from_args maps them
    "vocab_size",
    "make_vocab_size_divisible_by",
    "max_position_embeddings",
    "untie_embeddings_and_output_weights",
    "position_embedding_type",
    "rotary_base",
    "swiglu",
    "group_query_attention",
    "num_experts",
    # placeholders: the user's tokenizer and data
    "tokenizer_type",
    "tokenizer_model",
    "data_path",
    # mapped below as core_transformer_config_from_args maps them
    "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers",
    # validate_args turns them into accumulate_allreduce_grads_in_fp32, which training.py
    # gives DistributedDataParallelConfig as grad_reduce_in_fp32
    "grad_reduce_in_bf16",
    "accumulate_allreduce_grads_in_fp32",
}


def megatron_check(mcore, lines: list[str], p: dict, f: ModelFacts) -> None:
    """Each line a flag of Megatron-LM's parser with a valid value; the values built into
    megatron-core's configs (which validate them) and compared with the plan."""
    s = settings(p, f, "megatron")
    table = megatron_flag_table()
    ns: dict[str, object] = {}
    for line in lines:
        flag, eq, value = line.partition("=")
        assert flag in table, f"{flag} is not in Megatron-LM's parser (tests/data/megatron_training_flags.txt)"
        dest, action, opts = table[flag]
        if action in ("store_true", "store_false"):
            assert not eq, line
            ns[dest] = action == "store_true"
            continue
        assert action == "store" and eq, line
        if "choices" in opts:  # an enum's choices are written as its members (AttnBackend.fused)
            choices = [
                c.rpartition(".")[2] if opts.get("type") == "enum_type_handler" else c
                for c in opts["choices"].split(",")
            ]
            assert value in choices, line
        ns[dest] = {"int": int, "float": float}.get(opts.get("type", ""), str)(value)
    fields = {cls: {fl.name for fl in dataclasses.fields(cls)} for cls in (mcore.TC, mcore.DDP, mcore.Opt)}
    unplaced = set(ns) - MEGATRON_TRAINING_ONLY - set().union(*fields.values())
    assert not unplaced, f"flags with no megatron-core field: {unplaced}"
    # As Megatron-LM's validate_args and core_transformer_config_from_args make the configs:
    tc_kw = {k: v for k, v in ns.items() if k in fields[mcore.TC]}
    torch = mcore.torch
    tc_kw["pipeline_dtype"] = torch.half if ns.get("fp16") else torch.bfloat16 if ns.get("bf16") else torch.float32
    if "num_virtual_stages_per_pipeline_rank" in ns:
        tc_kw["virtual_pipeline_model_parallel_size"] = ns["num_virtual_stages_per_pipeline_rank"]
    tc_kw["num_layers_in_first_pipeline_stage"] = ns.get("decoder_first_pipeline_num_layers")
    tc_kw["num_layers_in_last_pipeline_stage"] = ns.get("decoder_last_pipeline_num_layers")
    from megatron.core.transformer.enums import AttnBackend

    tc_kw["attention_backend"] = AttnBackend[str(ns.get("attention_backend", "auto"))]
    # The model's flags, from the traced shape, as core_transformer_config_from_args maps them;
    # an MoE plan of a dense made-up shape gets experts (Megatron's biased experts need ETP 1).
    if ns.get("swiglu"):
        tc_kw.update(gated_linear_unit=True, activation_func=torch.nn.functional.silu)
    moe = s.expert_parallel > 1 or s.capacity_factor is not None
    if moe:
        tc_kw.setdefault("num_moe_experts", ns.get("num_experts", 4 * s.expert_parallel))
        tc_kw["add_bias_linear"] = False
    tc = mcore.TC(**tc_kw)
    shape = f.shape
    assert (tc.hidden_size, tc.num_attention_heads) == (shape["hidden_size"], shape["num_attention_heads"])
    assert tc.num_query_groups == shape.get("num_query_groups", shape["num_attention_heads"])
    assert tc.ffn_hidden_size == shape["ffn_hidden_size"] and tc.normalization == shape["normalization"]
    assert tc.gated_linear_unit == (shape["activation"] == "swiglu")
    assert ns["position_embedding_type"] == shape["position_embedding"]
    assert ns["vocab_size"] == shape["vocab_size"] and ns["make_vocab_size_divisible_by"] == 1
    assert ns.get("untie_embeddings_and_output_weights", False) == (not shape["tied_embeddings"])
    assert ns.get("add_bias_linear", True) == shape["linear_bias"]
    # Megatron-LM's dropout is 0.1 unless told: the model's own, read back from the configs.
    assert (tc.attention_dropout, tc.hidden_dropout) == (shape["attention_dropout"], shape["hidden_dropout"])
    ddp = mcore.DDP(**{k: v for k, v in ns.items() if k in fields[mcore.DDP]})
    opt = mcore.Opt(**{k: v for k, v in ns.items() if k in fields[mcore.Opt]})

    assert (tc.tensor_model_parallel_size, tc.pipeline_model_parallel_size) == (s.tp, s.pp)
    assert (tc.virtual_pipeline_model_parallel_size or 1) == s.virtual_stages
    assert tc.sequence_parallel == (s.sequence_parallel and s.tp > 1)
    assert tc.tp_comm_overlap == s.tp_overlap and (not s.tp_overlap or tc.sequence_parallel)  # validate_args
    # Megatron-LM's name of the TE recipe priced (tensorwise: TE's per-tensor current scaling)
    assert tc.fp8 == ("hybrid" if f.dtype == "fp8" else None)
    assert tc.fp8_recipe == ("tensorwise" if f.dtype == "fp8" and f.fp8_recipe == "current" else "delayed")
    assert tc.expert_model_parallel_size == s.expert_parallel
    assert tc.moe_expert_capacity_factor == s.capacity_factor
    assert tc.moe_pad_expert_input_to_capacity == (s.capacity_factor is not None)
    assert tc.num_layers == f.num_blocks and ns["seq_length"] == f.seq_len
    assert tc.recompute_granularity == {"none": None, "selective": "selective", "full": "full"}[s.recompute]
    if s.recompute == "full":
        assert (tc.recompute_method, tc.recompute_num_layers) == ("uniform", 1)
    assert ns["micro_batch_size"] == s.micro_batch and ns["global_batch_size"] == s.global_batch
    assert s.global_batch % (s.micro_batch * s.dp) == 0  # Megatron's micro-batch count per replica
    assert ddp.use_distributed_optimizer == opt.use_distributed_optimizer == (s.zero >= 1)
    assert ddp.use_megatron_fsdp == (s.zero >= 2)
    overlapped = f.dp_overlap and s.dp > 1
    assert ddp.overlap_grad_reduce == overlapped and ddp.overlap_param_gather == (overlapped and s.zero >= 1)
    if s.zero >= 2:
        assert ddp.data_parallel_sharding_strategy == ("optim_grads" if s.zero == 2 else "optim_grads_params")
        assert ns["ckpt_format"] == "fsdp_dtensor"
    assert (tc.fp16, tc.bf16, opt.optimizer) == (precision(f) == "fp16", precision(f) == "bf16", f.optimizer)
    # Transformer Engine's layers; the attention kernel priced (auto where not known).
    assert tc.transformer_impl == "transformer_engine"
    backend = megatron_attention_backend(f)
    assert tc.attention_backend.name == (backend[0] if backend else "auto")
    # The tokenizer and data: placeholders the user replaces.
    assert ns["tokenizer_model"].startswith("<REPLACE:") and ns["data_path"].startswith("<REPLACE:")
    # The split: Megatron's even one, or the layout megatron-core parsed, chunk i on rank i mod p.
    layout = tc.pipeline_model_parallel_layout
    first, last = tc.num_layers_in_first_pipeline_stage, tc.num_layers_in_last_pipeline_stage
    if first is not None or last is not None:  # uneven ends, the middle stages even (megatron-core's rule)
        ends = [n for n in (first, last) if n is not None]
        middle_stages = s.pp - len(ends)
        middle = (f.num_blocks - sum(ends)) // middle_stages if middle_stages else 0
        got = [first if first is not None else middle] + [middle] * (s.pp - 2) + [last if last is not None else middle]
    elif layout is None:
        assert f.num_blocks % (s.pp * s.virtual_stages) == 0  # Megatron-LM's validate_args
        got = [f.num_blocks // (s.pp * s.virtual_stages)] * (s.pp * s.virtual_stages)
    else:
        decoder = type(layout.layout[0][0][0]).decoder
        got = [layout.layout[i % s.pp][i // s.pp].count(decoder) for i in range(s.pp * s.virtual_stages)]
    assert got == list(s.chunk_blocks)
    # The device numbering: megatron-core's own rank generator, with the order Megatron-LM's
    # initialize.py gives it, puts a DP group's members and pipeline neighbours as phaze priced.
    order = "tp-cp-ep-pp-dp" if ns.get("use_tp_pp_dp_mapping") else "tp-cp-ep-dp-pp"
    ranks = mcore.Ranks(tp=s.tp, ep=1, dp=s.dp, pp=s.pp, cp=s.cp, order=order)
    t, c = s.tp, s.cp
    dp_stride, pp_stride = (t * c, t * c * s.dp) if s.rank_order == "tp-dp-pp" else (t * c * s.pp, t * c)
    assert ranks.get_ranks("dp")[0] == [k * dp_stride for k in range(s.dp)]
    assert ranks.get_ranks("pp")[0] == [k * pp_stride for k in range(s.pp)]
    # Context parallelism: the ring's neighbours t apart, the gradients shared over DP x CP (t apart),
    # as phaze's DP prices them (CP numbered between TP and DP).
    assert ranks.get_ranks("cp")[0] == [k * t for k in range(c)]
    shared = sorted(i * t + k * dp_stride for i in range(c) for k in range(s.dp))
    assert sorted(ranks.get_ranks("dp-cp")[0]) == shared  # t apart, d·c of them, under tp-dp-pp
    assert tc.context_parallel_size == c and (c == 1 or tc.cp_comm_type == "p2p")
    assert s.cp == 1 or ns["seq_length"] % (2 * s.cp) == 0  # Megatron-LM's validate_args


# --- end to end ---------------------------------------------------------------------------------


def test_phazec_exports_load_in_torchtitan_and_megatron(tmp_path, titan, mcore):
    """``phazec --hw a100 ... --export megatron F --export torchtitan G`` on a 4-block GPT-2 with
    interleaved 1F1B, sequence parallelism, ZeRO-3 and full recompute: both files hold the plan of
    the JSON, and both consumers take them."""
    model = tmp_path / "tiny_gpt2_4.py"
    model.write_text((MODELS / "tiny_gpt2.py").read_text().replace("n_layer=2", "n_layer=4"))
    out = {name: tmp_path / name for name in ("plan.json", "plan.megatron", "plan.titan", "plan.mlir")}
    r = run_main(
        "phazec", str(model), "--hw", "a100", "--devices", "16", "--global-batch", "32",
        "--micro-batch", "2", "--tp", "2", "--placement", "expert:2,4,2", "--recompute", "full",
        "--sequence-parallel", "on", "--zero", "3", "--pipeline-schedule", "interleaved:2",
        "--export", "megatron", str(out["plan.megatron"]), "--export", "torchtitan", str(out["plan.titan"]),
        "--json", str(out["plan.json"]), "-o", str(out["plan.mlir"]),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"wrote {out['plan.megatron']} (megatron arguments)" in r.stderr
    p = json.loads(out["plan.json"].read_text())
    assert (p["virtual_stages"], p["zero"], p["sequence_parallel"]) == (2, 3, True)
    assert p["rank_order"] == "tp-dp-pp"  # --rank-order auto narrowed: torchtitan's mesh is (pp, dp, tp)
    # 4 blocks, sequence 16; the shape as traced (phaze.model_shape)
    # GPT-2 built with eager attention (traced as separate ops: ""), on an A100 (sm_80).
    f = facts(4, seq_len=16, shape={**TINY_GPT2_SHAPE, TRACED_ATTENTION_KEY: ""}, compute_capability=8.0)
    m_lines, t_lines = out["plan.megatron"].read_text().splitlines(), out["plan.titan"].read_text().splitlines()
    assert m_lines == megatron_args(p, f) and t_lines == torchtitan_args(p, f, "plan_titan_flavour")
    assert "--attention-backend=unfused" in m_lines and "--transformer-impl=transformer_engine" in m_lines
    # torchtitan's flavour of the traced model, written beside its arguments, as the log says.
    flavour = tmp_path / "plan_titan_flavour.py"
    assert flavour.read_text() == torchtitan_flavour_file(f, "plan_titan_flavour")
    assert f"registered by {flavour}" in r.stderr
    # The runtimes the launches run that the plan was not priced as: once each on stderr (in the
    # summary), in the JSON's warnings and its summary.
    differ = [w["message"] for w in p["warnings"] if w["kind"] == "export-runtime"]
    assert differ and all(r.stderr.count(m) == 1 for m in differ), r.stderr
    # The kernels priced are the first export's (Megatron-LM's, the GPU default with --export
    # megatron): torchtitan's launch runs PyTorch's instead.
    assert any("priced with --kernels megatron" in m and m.startswith("--export torchtitan") for m in differ)
    assert any("FlexAttention" in m for m in differ) and all(f"warning: {m}" in p["summary"]["lines"] for m in differ)
    assert "--num-virtual-stages-per-pipeline-rank=2" in m_lines and "--sequence-parallel" in m_lines
    # The model's flags from the traced GPT-2; bf16 on the A100 under the default --dtype float16,
    # in both exports.
    for flag in ("--hidden-size=64", "--num-attention-heads=4", "--ffn-hidden-size=256", "--vocab-size=128"):
        assert flag in m_lines
    assert "--position-embedding-type=learned_absolute" in m_lines and "--max-position-embeddings=64" in m_lines
    assert "--bf16" in m_lines and "--fp16" not in m_lines
    assert "--training.mixed_precision_param=bfloat16" in t_lines
    assert "its model flavour" in r.stderr and "dim=64, n_heads=4" in r.stderr
    megatron_check(mcore, m_lines, p, f)
    titan_check(titan, t_lines, p, f, flavour_dir=tmp_path)


def test_phazec_exports_an_interleaving_whose_blocks_do_not_split_evenly(tmp_path, mcore):
    """8 blocks over PP 2 × VP 3: no even split and none counting the embedding or loss as a
    block, so the DP lays the 6 chunks out as NeMo does DeepSeek-V3's 61 blocks
    ([2, 2, 1, 1, 1, 1]); the Megatron-LM export writes that layout, which megatron-core parses
    back to the priced chunks (megatron_check)."""
    out = {name: tmp_path / name for name in ("plan.json", "plan.megatron", "plan.mlir")}
    r = run_main(
        "phazec", str(MODELS / "tiny_gpt2_deep.py"), "--hw", "a100", "--devices", "8", "--global-batch", "64",
        "--micro-batch", "1", "--placement", "expert:2,4,1", "--pipeline-schedule", "interleaved:3",
        "--export", "megatron", str(out["plan.megatron"]), "--json", str(out["plan.json"]), "-o", str(out["plan.mlir"]),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    p = json.loads(out["plan.json"].read_text())
    assert (p["pp"], p["virtual_stages"]) == (2, 3)
    f = facts(8, seq_len=16, shape={**TINY_GPT2_SHAPE, TRACED_ATTENTION_KEY: ""}, compute_capability=8.0)
    lines = out["plan.megatron"].read_text().splitlines()
    assert lines == megatron_args(p, f)
    assert "--pipeline-model-parallel-layout=Et*2|t*2|t|t|t|tL" in lines
    assert not any(line.startswith("--num-virtual-stages-per-pipeline-rank") for line in lines)
    megatron_check(mcore, lines, p, f)


def test_a_refused_export_writes_nothing(tmp_path):
    """A plan torchtitan cannot run (ZeRO-1): one line, exit 1, and no output is written."""
    exp, js, mlir = tmp_path / "plan.titan", tmp_path / "plan.json", tmp_path / "plan.mlir"
    r = run_main(
        "phazec", str(MODELS / "tiny_gpt2.py"), "--hw", "a100", "--devices", "8", "--global-batch", "16",
        "--micro-batch", "2", "--tp", "1", "--placement", "expert:1,8,1", "--zero", "1",
        "--export", "torchtitan", str(exp), "--json", str(js), "-o", str(mlir),
    )  # fmt: skip
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "phazec: error: --export torchtitan: ZeRO-1 shards the optimizer state but not the parameters" in r.stderr
    assert not exp.exists() and not js.exists() and not mlir.exists()


def test_export_torchtitan_searches_only_plans_it_launches(tmp_path, titan):
    """``--zero auto --recompute auto --pipeline-schedule auto --export torchtitan``: the plan
    kept is one torchtitan runs (ZeRO 0 or 3, one recompute policy), so the export is written
    and loads in torchtitan, exit 0."""
    exp, js = tmp_path / "plan.titan", tmp_path / "plan.json"
    r = run_main(
        "phazec", str(MODELS / "tiny_gpt2.py"), "--hw", "h100", "--devices", "8", "--global-batch", "16",
        "--micro-batch", "2", "--tp", "1", "--zero", "auto", "--recompute", "auto", "--pipeline-schedule", "auto",
        "--export", "torchtitan", str(exp), "--json", str(js), "-o", str(tmp_path / "plan.mlir"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    p = json.loads(js.read_text())
    assert p["zero"] in (0, 3) and len({st["recompute"] for st in p["stages"]}) == 1
    f = facts(2, seq_len=16, shape=TINY_GPT2_SHAPE)
    lines = exp.read_text().splitlines()
    assert lines == torchtitan_args(p, f, "plan_titan_flavour")
    titan_check(titan, lines, p, f, flavour_dir=tmp_path)  # the flavour file phazec wrote beside it


def test_launchable_choices_narrow_auto_to_what_each_target_runs():
    """torchtitan: ZeRO 0 or 3 and one recompute policy, each a search; Megatron-LM: every ZeRO
    stage (one search for them), one recompute policy; fixed choices and no export: no narrowing."""
    titan = [("torchtitan", "f")]
    got = launchable_choices(titan, "auto", "auto")
    assert got == [{"zero": z, "recompute": r} for z in ("0", "3") for r in ("none", "selective", "full")]
    assert launchable_choices([("megatron", "f")], "auto", "auto") == [
        {"recompute": r} for r in ("none", "selective", "full")
    ]
    assert launchable_choices(titan, "3", "full") == [{}]
    assert launchable_choices(titan, "auto", "full") == [{"zero": "0"}, {"zero": "3"}]
    assert launchable_choices(None, "auto", "auto") == [{}]
    # Selective recompute a target has not is no choice of it: Megatron-LM's is the attention core's.
    assert launchable_choices([("megatron", "f")], "3", "auto", "op") == [{"recompute": r} for r in ("none", "full")]
    assert launchable_choices(titan, "3", "auto", "op") == [{"recompute": r} for r in ("none", "selective", "full")]
    # Under context parallelism torchtitan shards the weights over its CP group: ZeRO-3 only.
    assert launchable_choices(titan, "auto", "full", context_parallel="auto") == [{"zero": "3"}]
    assert launchable_choices([("megatron", "f")], "auto", "full", context_parallel="2") == [{}]


@pytest.mark.parametrize("exports", [["megatron"], ["torchtitan"], ["megatron", "torchtitan"]])
@pytest.mark.parametrize("selective", ["attention", "op", "layer:2"])
def test_a_placement_refused_before_compiling_is_refused_as_the_plan_is(exports, selective):
    """The sweep judges its fastest point's placement (ZeRO stage, CP, each stage's recompute
    policy) before compiling it (``Launchable.refusal``): refused exactly when the exports
    refuse the plan of that placement, in the first refusal's words."""
    requests = [(target, f"plan.{target}") for target in exports]
    launch = Launchable(tuple(exports), (), selective, "adam")
    for zero in range(4):
        for cp in (1, 2):
            for recompute in ("none", "selective", "full", ["full", "none"]):
                p = plan([4, 4], zero=zero, cp=cp, recompute=recompute)
                said = refusals(requests, p, facts(8, seq_len=4096, selective_recompute=selective))
                policies = recompute if isinstance(recompute, list) else [recompute] * 2
                assert launch.refusal(zero, cp, policies) == (said[0] if said else None), (zero, cp, recompute)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"context_parallel": "2", "zero": "0"}, "which ZeRO 0 does not: compile with --zero 3"),
        ({"tp_overlap": "on", "kernels": "eager"}, "async TP runs under torch.compile only"),
    ],
)
def test_torchtitan_refuses_cp_without_zero_3_and_async_tp_without_compile_before_any_work(given, message):
    from types import SimpleNamespace

    from phaze.plan.export import export_outputs

    args = SimpleNamespace(export=[("torchtitan", "t.args")], hw="h100", emit="plan", **given)
    with pytest.raises(PhazeError, match=message):
        export_outputs(args)
    ok = SimpleNamespace(export=[("megatron", "m.args")], hw="h100", emit="plan", **given)
    assert export_outputs(ok) == [("--export megatron", "m.args")]


@pytest.mark.parametrize(
    ("exports", "recipe", "message"),
    [
        (["torchtitan"], "delayed", "Transformer Engine's (delayed scaling), which torchtitan does not run"),
        (["torchtitan"], "tensorwise", "takes recipe_name rowwise or rowwise_with_gw_hp, not torchao's tensorwise"),
        (["megatron"], "rowwise", "torchao's (rowwise scaling, torchtitan's float8)"),
        (["megatron", "torchtitan"], None, "no FP8 recipe runs on both"),
        (["torchtitan"], None, None),  # auto: torchao's rowwise, torchtitan's converter's
        (["megatron"], None, None),  # auto: TE's delayed
        (["megatron"], "current", None),
    ],
)
def test_an_fp8_recipe_the_target_does_not_run_is_refused_before_any_work(exports, recipe, message):
    """``--dtype fp8`` is launched by the runtime whose recipe was priced: Transformer Engine's
    (delayed, current) by Megatron-LM, torchao's rowwise by torchtitan (0.3.0 has no
    tensorwise converter recipe); refused from the options alone, one line."""
    from types import SimpleNamespace

    from phaze.plan.export import export_outputs

    args = SimpleNamespace(
        export=[(t, f"{t}.args") for t in exports], hw="h100", emit="plan", dtype="fp8", fp8_recipe=recipe
    )
    if message is None:
        assert len(export_outputs(args)) == len(exports)
        return
    with pytest.raises(PhazeError, match=re.escape(message)) as e:
        export_outputs(args)
    assert "\n" not in str(e.value)


def test_a_refused_export_leaves_the_other_outputs_written(tmp_path):
    """An export refused after the search (a plan whose pipeline transfers are split over the TP
    group, which neither target sends so) is one line; -o, --json and the other outputs are
    written, and the exit status is phaze.messages.PARTIAL, not 0 nor 1."""
    from phaze.messages import PARTIAL

    exp, js, mlir = tmp_path / "plan.megatron", tmp_path / "plan.json", tmp_path / "plan.mlir"
    r = run_main(
        "phazec", str(MODELS / "tiny_gpt2.py"), "--hw", "a100", "--devices", "8", "--global-batch", "16",
        "--micro-batch", "2", "--tp", "2", "--placement", "expert:2,2,2", "--pipeline-transfer", "split",
        "--export", "megatron", str(exp), "--json", str(js), "-o", str(mlir),
    )  # fmt: skip
    assert r.returncode == PARTIAL and PARTIAL not in (0, 1, 2), r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("phazec: error:")]
    assert len(errors) == 1 and "splits its pipeline transfers over the TP group" in errors[0]
    assert f"{exp} not written" in errors[0] and "Traceback" not in r.stderr
    assert not exp.exists() and js.exists() and mlir.exists()
    assert json.loads(js.read_text())["pipeline_transfer"] == "split"


def test_torchtitan_flavour_names_torchtitans_fields(titan):
    """The flavour phazec says for --export torchtitan names the fields of torchtitan 0.3.0's
    Llama3 flavour (Llama3Model.Config, _build_llama3_layers, its rope config) with the traced
    values, and builds one."""
    import inspect

    from torchtitan.models import llama3

    fields, unknown = torchtitan_flavour(facts(4))
    assert unknown == []
    values = dict(field.split("=", 1) for field in fields)
    build = inspect.signature(llama3._build_llama3_layers).parameters
    layer_fields = {"n_layers", "dim", "n_heads", "n_kv_heads", "hidden_dim"}
    assert layer_fields <= set(build)
    assert "vocab_size" in {fl.name for fl in dataclasses.fields(llama3.Llama3Model.Config)}
    assert values["dim"] == "128" and values["n_kv_heads"] == "4" and values["n_layers"] == "4"
    rope = llama3.ComplexRoPE.Config(
        dim=SHAPE["hidden_size"] // SHAPE["num_attention_heads"],
        theta=float(values["rope.theta"]),
        max_seq_len=int(values["rope.max_seq_len"]),
    )
    layers = llama3._build_llama3_layers(**{k: int(values[k]) for k in layer_fields}, rope=rope, attn_backend="flex")
    assert len(layers) == 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--export", "megatron", "x.args"], "--export needs a plan for one accelerator (--hw CHIP"),
        (["--hw", "a100", "--export", "deepspeed", "x.args"], "--export deepspeed: unknown target"),
        (["--hw", "a100", "--export", "megatron", "-"], "--export megatron needs a file name"),
        (["--hw", "a100", "--json", "{tmp}/p", "--export", "megatron", "{tmp}/p"], "is also --json"),
        (["--hw", "a100", "--export", "torchtitan", "MODEL"], "is the model file"),
        (["--hw", "a100", "--dtype", "amp-float16", "--export", "torchtitan", "x"], "has no fp16 mixed precision"),
        (["--hw", "a100", "--dtype", "float16", "--export", "torchtitan", "x"], "has no fp16 mixed precision"),
        (
            ["--hw", "a100", "--recompute", "selective", "--selective-recompute", "layer:2"]
            + ["--export", "torchtitan", "x"],
            "--export torchtitan: torchtitan 0.3.0 has no selective layer checkpointing (layer:2",
        ),
        (
            ["--hw", "a100", "--recompute", "selective", "--selective-recompute", "op", "--export", "megatron", "x"],
            "--export megatron: the plan's selective recompute is torchtitan's (op)",
        ),
        (["--hw", "a100", "--selective-recompute", "layer:0"], "--selective-recompute layer:0: expected attention"),
    ],
)
def test_export_paths_and_targets_are_checked_before_any_work(tmp_path, args, message):
    model = str(MODELS / "tiny_gpt2.py")
    args = [a.replace("{tmp}", str(tmp_path)).replace("MODEL", model) for a in args]
    r = run_main("phazec", model, *args, "-q")
    assert r.returncode == 1 and message in r.stderr and "traced" not in r.stderr


# --- every dimension, through both consumers ---------------------------------------------------------

CASES = {
    # name: (plan, facts)
    "pp1-dp8-accumulation": (plan([6], dp=8, pp=1, tp=1, b=1, m=4), facts(6)),
    "1f1b-even-sp-selective-zero0": (
        plan([4, 4, 4, 4], pp=4, recompute="selective", sequence_parallel=True),
        facts(16),
    ),
    "1f1b-uneven-full-bf16": (plan([3, 5, 5, 3], pp=4, recompute="full"), facts(16, dtype="bfloat16")),
    "1f1b-empty-first-stage": (plan([0, 4, 4], pp=3, tp=1), facts(8, dtype="float32")),
    "interleaved-even-zero3-sp": (
        plan([2, 2, 2, 2, 2, 2], pp=2, sequence_parallel=True, virtual_stages=3, zero=3),
        facts(12),
    ),
    "interleaved-uneven-zero3": (plan([1, 2, 2, 2, 2, 1], pp=3, virtual_stages=2, zero=3, tp=1), facts(10)),
    "tp4-ep2-sp-zero3-full": (
        plan([8, 8], pp=2, tp=4, recompute="full", expert_parallel=2, zero=3, sequence_parallel=True),
        facts(16),
    ),
    "cp4-tp2-zero3-full": (plan([4, 4], pp=2, tp=2, cp=4, recompute="full", zero=3), facts(8, seq_len=32768)),
}
#: Megatron-LM only: torchtitan 0.3.0 refuses a capacity factor (REFUSED).
MEGATRON_CASES = {
    "ep2-capacity-factor": (plan([4, 4], tp=1, expert_parallel=2, capacity_factor=1.25), facts(8)),
    "capacity-factor-no-ep": (plan([4, 4], tp=2, sequence_parallel=True, capacity_factor=1.0), facts(8)),
}
#: Megatron-LM only too: torchtitan refuses both (REFUSED): its float8 is rowwise, its async TP
#: needs torch.compile.
MEGATRON_PRECISION_CASES = {
    "fp8-hybrid": (plan([4, 4], tp=2), facts(8, dtype="fp8")),
    "fp8-current-scaling": (plan([4, 4], tp=2), facts(8, dtype="fp8", fp8_recipe="current")),
    "grad-reduce-in-bf16": (plan([4, 4], tp=2, zero=1), facts(8, dtype="bfloat16", reduce_dtype="bf16")),
    "fp16-reduced-in-fp32": (plan([4, 4], tp=2), facts(8, dtype="amp-float16")),
    "tp-comm-overlap": (plan([4, 4], tp=2, sequence_parallel=True, tp_overlap=True), facts(8)),
    "everything": (
        plan([3, 5, 5, 3], pp=4, tp=2, cp=2, zero=1, sequence_parallel=True, tp_overlap=True, recompute="full"),
        facts(
            16,
            dtype="fp8",
            dp_overlap=True,
            kernels="megatron",
            compute_capability=9.0,
            shape={**SHAPE, TRACED_ATTENTION_KEY: "_scaled_dot_product_flash_attention causal"},
        ),
    ),
}


@pytest.mark.parametrize("name", list(MEGATRON_PRECISION_CASES))
def test_megatron_fp8_and_tp_overlap_load(name, mcore):
    p, f = MEGATRON_PRECISION_CASES[name]
    megatron_check(mcore, megatron_args(p, f), p, f)


@pytest.mark.parametrize("name", list(CASES))
def test_export_matrix_loads_in_both(name, titan, mcore):
    p, f = CASES[name]
    megatron_check(mcore, megatron_args(p, f), p, f)
    titan_check(titan, torchtitan_args(p, f), p, f)


def test_torchtitan_runs_its_per_op_selective_checkpointing(titan):
    """Selective recompute priced as torchtitan's per-op policy (``--selective-recompute op``)
    is torchtitan 0.3.0's ``SelectiveAC``; Megatron-LM, whose selective recompute re-runs the
    attention core, refuses it, and torchtitan refuses every-N-th-block checkpointing."""
    p = plan([8], dp=8, pp=1, tp=1, recompute="selective", zero=3)
    f = facts(8, selective_recompute="op")
    lines = torchtitan_args(p, f)
    assert lines[-1] == "activation-checkpoint:selective"
    titan_check(titan, lines, p, f)
    with pytest.raises(PhazeError, match="Megatron-LM's re-runs the attention core"):
        megatron_args(p, f)
    with pytest.raises(PhazeError, match="no selective layer checkpointing"):
        torchtitan_args(p, facts(8, selective_recompute="layer:2"))
    # Megatron's selective recompute (the default) runs in torchtitan without checkpointing.
    assert torchtitan_args(p, facts(8))[-1] == "activation-checkpoint:none"


def test_megatron_numbers_devices_as_priced(mcore):
    """A plan numbered tp-pp-dp (data parallelism outermost) gets Megatron-LM's
    --use-tp-pp-dp-mapping, and megatron-core's rank generator then puts the DP groups and the
    pipelines where phaze priced them (megatron_check); one numbered tp-dp-pp, or where the two
    are one (DP or PP of 1), gets no flag."""
    p, f = plan([4, 4], dp=2, pp=2, tp=2, rank_order="tp-pp-dp"), facts(8)
    args = megatron_args(p, f)
    assert "--use-tp-pp-dp-mapping" in args
    megatron_check(mcore, args, p, f)
    for other in (plan([4, 4], dp=2, pp=2, tp=2), plan([8], dp=2, pp=1, rank_order="tp-pp-dp")):
        args = megatron_args(other, f)
        assert "--use-tp-pp-dp-mapping" not in args
        megatron_check(mcore, args, other, f)


@pytest.mark.parametrize("name", list(MEGATRON_CASES))
def test_megatron_capacity_factor(name, mcore):
    """A plan padded to an MoE capacity factor: Megatron-LM's capacity factor with its experts'
    input padded to capacity (so every expert runs the rows priced), through megatron-core."""
    p, f = MEGATRON_CASES[name]
    args = megatron_args(p, f)
    factor = p["capacity_factor"]
    assert f"--moe-expert-capacity-factor={factor!r}" in args and "--moe-pad-expert-input-to-capacity" in args
    megatron_check(mcore, args, p, f)
    assert not any("capacity" in a for a in megatron_args({**p, "capacity_factor": None}, f))


@pytest.mark.parametrize("zero", [1, 2])
def test_megatron_zero_1_and_2(zero, mcore):
    """ZeRO-1: the distributed optimizer; ZeRO-2: Megatron-FSDP's optim_grads."""
    p, f = plan([4, 4], zero=zero, recompute="selective"), facts(8, optimizer="sgd")
    args = megatron_args(p, f)
    assert "--use-distributed-optimizer" in args and ("--use-megatron-fsdp" in args) == (zero == 2)
    megatron_check(mcore, args, p, f)


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_megatron_overlap_flags_are_the_priced_ones(zero, mcore):
    """--dp-overlap priced: the gradient reduce-scatter overlapped, and with the distributed
    optimizer (or Megatron-FSDP) its parameter all-gather too, which validate_args allows only
    beside --overlap-grad-reduce."""
    p, f = plan([4, 4], zero=zero), facts(8, dp_overlap=True)
    args = megatron_args(p, f)
    assert "--overlap-grad-reduce" in args and ("--overlap-param-gather" in args) == (zero >= 1)
    megatron_check(mcore, args, p, f)
    assert "--overlap-grad-reduce" not in megatron_args(p, facts(8))


def test_the_models_dropout_is_read_and_launched():
    """Llama drops nothing (its config's attention_dropout 0, no dropout module); GPT-2 its
    config's 0.1s; Megatron-LM would drop 0.1 of both unless told."""
    import torch

    from phaze_ir.frontend.loader import load_model_file
    from phaze_ir.frontend.shape import model_shape

    with torch.device("meta"):
        llama, gpt2 = (
            model_shape(load_model_file(MODELS / f).get_model()) for f in ("tiny_llama_sdpa.py", "tiny_gpt2.py")
        )
    assert (llama["attention_dropout"], llama["hidden_dropout"]) == (0.0, 0.0)
    assert (gpt2["attention_dropout"], gpt2["hidden_dropout"]) == (0.1, 0.1)
    args = megatron_args(plan([4, 4]), facts(8))
    assert "--attention-dropout=0.0" in args and "--hidden-dropout=0.0" in args
    unknown = {k: v for k, v in SHAPE.items() if k != "hidden_dropout"}
    assert "--hidden-dropout" in megatron_model_args(facts(8, shape=unknown))[1]


def test_megatron_layout_string():
    assert megatron_layout([3, 4, 4, 3]) == "Et*3|t*4|t*4|t*3L"
    assert megatron_layout([0, 1, 2]) == "E|t|t*2L"
    assert megatron_layout([5]) == "Et*5L"


def test_every_flag_phaze_writes_is_in_megatron_lms_parser():
    table = megatron_flag_table()
    assert set(MEGATRON_FLAGS) == set(table)
    header = (DATA / "megatron_training_flags.txt").read_text()
    assert "github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553" in header


def test_torchtitan_split_is_torchtitans(titan):
    """phaze's copy of torchtitan's pipeline split gives torchtitan's answer (or its refusal)."""
    for stages in (1, 2, 3, 4, 6):
        for layers in (2, 5, 8, 12):
            for inw in range(3):
                for outw in range(3):
                    try:
                        parts = titan.pp._generate_llm_fqn_per_model_part(stages, layers, inw, outw)
                        theirs = [sum(n.startswith("layers.") for n in part) for part in parts]
                    except ValueError:
                        theirs = None
                    assert torchtitan_stage_blocks(stages, layers, inw, outw) == theirs, (stages, layers, inw, outw)


def test_expert_parallel_with_tensor_parallel_needs_sequence_parallel_for_megatron():
    """Megatron-LM asserts sequence parallelism when EP and TP are both > 1 (its MoE token
    dispatcher splits the tokens over the TP ranks); phaze refuses such a plan for it."""
    bad = plan([4, 4], expert_parallel=2)
    with pytest.raises(PhazeError, match="expert parallelism with tensor parallelism needs sequence parallelism"):
        megatron_args(bad, facts(8))
    ok = megatron_args({**bad, "sequence_parallel": True}, facts(8))
    assert "--expert-model-parallel-size=2" in ok and "--sequence-parallel" in ok
    assert "--expert-model-parallel-size=2" in megatron_args(plan([4, 4], tp=1, expert_parallel=2), facts(8))


def test_expert_parallel_with_context_parallel_is_refused_for_megatron():
    """phaze prices EP under CP in Megatron-core 0.9's numbering (the EP group within one CP
    rank); the pinned Megatron-LM folds the EP group over the CP ranks, so the export refuses
    the pair, in one line, and writes either alone."""
    ep_cp = plan([4, 4], tp=1, expert_parallel=2, cp=2)
    with pytest.raises(PhazeError, match="expert parallelism 2 with context parallelism 2 is priced as"):
        megatron_args(ep_cp, facts(8))
    assert "--context-parallel-size=2" in megatron_args({**ep_cp, "expert_parallel": 1}, facts(8))
    assert "--expert-model-parallel-size=2" in megatron_args(plan([4, 4], tp=1, expert_parallel=2), facts(8))


# --- refusals, one line each ---------------------------------------------------------------------------

REFUSED = [
    ("both", plan([4, 4], feasible=False, binding="memory"), facts(8), "the plan is not feasible (memory)"),
    ("both", plan([4, 4], recompute=["full", "none"]), facts(8), "different recompute policies (full, none)"),
    ("both", plan([8], pp=1, virtual_stages=2), facts(8), "interleaved 1F1B (2 chunks per device) needs pipeline"),
    ("both", {**plan([4, 4]), "global_batch": 33}, facts(8), "the global batch 33 is not DP 2 x micro-batch 2 x 4"),
    ("both", {**plan([4, 4]), "devices_used": 16}, facts(8), "the plan uses 16 devices, not DP x PP x TP = 8"),
    ("both", plan([2, 2, 2, 2], virtual_stages=2, pp=2), facts(8), None),  # accepted: a control
    (
        "both",
        {
            **plan([2, 2, 2, 2], virtual_stages=2),
            "stages": [
                {**st, "rank": r} for st, r in zip(plan([2, 2, 2, 2], virtual_stages=2)["stages"], [0, 0, 1, 1])
            ],
        },
        facts(8),
        "chunk 1 runs on pipeline rank 0",
    ),  # fmt: skip
    ("both", plan([4, 4]), ModelFacts(layer_kinds=("prologue", "head", "block", "head")), "layer 1 is a head"),
    ("both", plan([3, 4]), facts(8), "the stages end at layer 8 of 9"),
    ("torchtitan", plan([4, 4], zero=1), facts(8), "ZeRO-1 shards the optimizer state but not the parameters"),
    ("torchtitan", plan([4, 4], rank_order="tp-pp-dp"), facts(8), "torchtitan's device mesh is pp, dp, tp"),
    ("torchtitan", plan([8], pp=1, rank_order="tp-pp-dp"), facts(8), None),  # one numbering at PP 1
    (
        "megatron",
        plan([4, 4], tp=1, expert_parallel=2, rank_order="tp-pp-dp"),
        facts(8),
        "--use-tp-pp-dp-mapping puts expert parallelism inside the pipeline",
    ),
    ("both", {**plan([4, 4]), "rank_order": "pp-dp-tp"}, facts(8), "the plan's rank_order is 'pp-dp-tp'"),
    ("torchtitan", plan([4, 4], zero=2), facts(8), "ZeRO-2 shards the optimizer state and gradients"),
    ("torchtitan", plan([4, 4]), facts(8, optimizer="sgd"), "torchtitan 0.3.0 has no sgd optimizer"),
    ("torchtitan", plan([4, 4]), facts(8, optimizer="adam-foreach"), "adam-foreach: the job it writes leaves"),
    ("megatron", plan([4, 4]), facts(8, optimizer="adam-foreach"), "is not Megatron-LM's fused Adam"),
    ("torchtitan", plan([1, 3, 4], pp=3), facts(8), "torchtitan cannot split the 8 blocks as the plan does (1, 3, 4"),
    ("torchtitan", plan([4, 4], capacity_factor=1.25), facts(8), "pads the experts to capacity factor 1.25"),
    ("torchtitan", plan([4, 4], cp=2), facts(8, seq_len=4096), "shards the weights over its CP group"),
    ("torchtitan", plan([4, 4]), facts(8, dtype="fp8"), "Transformer Engine's (delayed scaling), which torchtitan"),
    ("torchtitan", plan([4, 4]), facts(8, dtype="fp8", fp8_recipe="tensorwise"), "not torchao's tensorwise"),
    ("torchtitan", plan([4, 4]), facts(8, dtype="fp8", fp8_recipe="rowwise", fp8_params=True), "without --fp8-params"),
    ("megatron", plan([4, 4]), facts(8, dtype="fp8", fp8_recipe="rowwise"), "torchao's (rowwise scaling"),
    (
        "torchtitan",
        plan([4, 4], sequence_parallel=True, tp_overlap=True),
        facts(8),
        "async TP runs under torch.compile",
    ),
    ("both", {**plan([4, 4], cp=2), "devices_used": 8}, facts(8), "not DP x PP x TP x CP = 16"),
    ("both", plan([4, 4], capacity_factor=0.5), facts(8), "the plan's capacity_factor is 0.5, not a number >= 1"),
    ("both", plan([4, 4], pipeline_transfer="split"), facts(8), "splits its pipeline transfers over the TP group"),
    ("both", plan([8], pp=1, pipeline_transfer="split"), facts(8), None),
]


@pytest.mark.parametrize(("target", "p", "f", "message"), REFUSED)
def test_refusals_are_one_line(target, p, f, message):
    for fn, name in ((megatron_args, "megatron"), (torchtitan_args, "torchtitan")):
        if target not in ("both", name):
            continue
        if message is None:
            fn(p, f)
            continue
        with pytest.raises(PhazeError) as e:
            fn(p, f)
        text = str(e.value)
        assert "\n" not in text and text.startswith(f"--export {name}: ") and message in text, text


def test_megatron_takes_splits_torchtitan_cannot():
    """Megatron's layout is exact for any contiguous split; torchtitan's weights are not."""
    p, f = plan([1, 3, 4], pp=3), facts(8)
    args = megatron_args(p, f)  # uneven ends, an even middle: Megatron-LM's own flags for it
    assert "--decoder-first-pipeline-num-layers=1" in args and "--decoder-last-pipeline-num-layers=4" in args
    assert "--pipeline-model-parallel-layout=Et*3|t*2|t*3|L" in megatron_args(plan([3, 2, 3, 0], pp=4), facts(8))
    assert torchtitan_split([1, 3, 4], interleaved=False) is None
    assert torchtitan_split([1, 6, 1], interleaved=False) == (5, 4, None)  # embedding as 5 layers, head as 4


@pytest.mark.skipif(not os.environ.get("MEGATRON_LM"), reason="set MEGATRON_LM to a Megatron-LM checkout")
def test_megatron_lm_validates_the_exports(tmp_path):
    """With a Megatron-LM checkout (``MEGATRON_LM``): its own parser and validate_args take the
    exports of the matrix (tests/data/megatron_training_flags.py --check)."""
    import subprocess
    import sys

    numbered = {"tp-pp-dp-mapping": (plan([4, 4], dp=2, pp=2, tp=2, rank_order="tp-pp-dp"), facts(8))}
    # 8 blocks over 6 chunks as NeMo lays out DeepSeek-V3 (no even or counted split;
    # torchtitan's interleaved split cannot make it, so Megatron-LM only)
    layout = {"interleaved-layout": (plan([2, 2, 1, 1, 1, 1], pp=2, virtual_stages=3, tp=1), facts(8))}
    for name, (p, f) in {**CASES, **MEGATRON_CASES, **MEGATRON_PRECISION_CASES, **numbered, **layout}.items():
        path = tmp_path / f"{name}.args"
        path.write_text("".join(a + "\n" for a in megatron_args(p, f)))
        r = subprocess.run(
            [sys.executable, str(DATA / "megatron_training_flags.py"), os.environ["MEGATRON_LM"], "--check",
             str(path), "--world-size", str(p["devices_used"])],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == 0 and "validated by Megatron-LM" in r.stdout, r.stderr[-2000:]


def test_float16_asked_by_name_launches_fp16_the_default_bf16():
    from phaze.plan.export import precision

    assert precision(facts(2)) == "bf16"  # phazec's default float16 on a chip with bf16
    assert precision(facts(2, dtype_asked=True)) == "fp16"  # --dtype float16, asked
    assert precision(facts(2, bf16=False)) == "fp16"
    assert precision(facts(2, dtype="amp-bfloat16", dtype_asked=True)) == "bf16"


# --- the runs as priced: issue 57 items 2-4 ----------------------------------------------------------

#: Llama 3 8B's shape as phaze_ir.frontend.shape reads examples/llama3_8b.py, its attention traced
#: as SDPA's flash kernel.
LLAMA3_8B = {
    **SHAPE,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_query_groups": 8,
    "ffn_hidden_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    TRACED_ATTENTION_KEY: "_scaled_dot_product_flash_attention causal",
}


def test_torchtitans_registered_runs_are_as_phaze_names_them(titan):
    """Each run of TORCHTITAN_REGISTERED is torchtitan 0.3.0's own config of that name, whose model
    has the fields phaze matches a traced model against."""
    from torchtitan.models.llama3 import config_registry

    from phaze.plan.export import TORCHTITAN_LLAMA3_COMMON, TORCHTITAN_REGISTERED

    for name, want in TORCHTITAN_REGISTERED.items():
        model = getattr(config_registry, name)().model_spec.model
        block = model.layers[0]
        got = {
            "n_layers": len(model.layers),
            "dim": model.dim,
            "n_heads": block.attention.n_heads,
            "n_kv_heads": block.attention.n_kv_heads,
            "hidden_dim": block.feed_forward.w1.out_features,
        }
        assert got == want, name
        common = {"vocab_size": model.vocab_size, "rope.theta": block.attention.rope.theta}
        assert common == TORCHTITAN_LLAMA3_COMMON, name


def test_llama3_8b_launches_as_torchtitans_registered_run(titan):
    """A Llama 3 8B plan names torchtitan's llama3_8b: its ConfigManager loads the arguments as
    written (nothing prepended) and its builder makes the 8B model; no flavour file is needed."""
    shape = LLAMA3_8B
    f = facts(32, seq_len=8192, shape=shape, kernels="eager", dtype="amp-bfloat16", compute_capability=9.0)
    p = plan([32], dp=8, pp=1, tp=1, b=1, m=8, zero=3, recompute="full")
    lines = torchtitan_args(p, f)
    assert lines[:2] == ["--module=llama3", "--config=llama3_8b"]
    titan_check(titan, lines, p, f)
    # A model torchtitan has not registered (here 31 blocks) gets its flavour file instead.
    other = torchtitan_args(plan([31], dp=8, pp=1, tp=1, b=1, m=8, zero=3), facts(31, seq_len=8192, shape=shape))
    assert other[:2] == ["--module=phaze_flavour", "--config=phaze_plan"]


def test_torchtitan_fp8_is_torchaos_rowwise_converter_in_its_flavour_file(titan, monkeypatch):
    """An FP8 plan priced as torchao's rowwise Float8Linear (``--fp8-recipe rowwise``) launches
    through its flavour file, whose ``phaze_plan`` builds the model with torchtitan 0.3.0's
    ``Float8LinearConverter`` (recipe rowwise, the LM head filtered, compiled as priced): the
    only way 0.3.0 sets a converter.  ConfigManager loads the export with nothing prepended;
    the converter's build is stubbed here (it needs torchao and an SM89 GPU), and records what
    it was given."""
    from torchtitan.components.quantization import float8

    given = []

    def init(self, config):
        given.append(config)
        self.config, self.enabled = config, False  # convert() then leaves the model as built

    monkeypatch.setattr(float8.Float8LinearConverter, "__init__", init)
    p = plan([8], dp=8, pp=1, tp=1, zero=3)
    f = facts(8, dtype="fp8", fp8_recipe="rowwise", kernels="inductor")
    lines = torchtitan_args(p, f)
    assert lines[:2] == ["--module=phaze_flavour", "--config=phaze_plan"]
    titan_check(titan, lines, p, f)
    (config,) = given
    assert (config.recipe_name, config.filter_fqns, config.model_compile_enabled) == ("rowwise", ["lm_head"], True)
    # a model torchtitan registers gets the file too under FP8 (its converter is set in Python)
    llama8b = {**SHAPE, "hidden_size": 4096, "num_attention_heads": 32, "num_query_groups": 8}
    llama8b |= {"ffn_hidden_size": 14336, "vocab_size": 128256, "rotary_base": 500000}
    p = plan([32], dp=8, pp=1, tp=1, zero=3)
    assert torchtitan_args(p, facts(32, shape=llama8b, dtype="bfloat16"))[0] == "--module=llama3"
    assert torchtitan_args(p, facts(32, shape=llama8b, dtype="fp8", fp8_recipe="rowwise"))[0] != "--module=llama3"


def test_torchtitan_compiles_the_model_priced_compiled(titan):
    """--kernels inductor: --compile.enable (and async TP with the TP overlap priced); eager: not."""
    p = plan([4, 4], tp=2, zero=3, sequence_parallel=True, tp_overlap=True)
    f = facts(8, kernels="inductor")
    lines = torchtitan_args(p, f)
    assert "--compile.enable" in lines and "--compile.enable_async_tensor_parallel" in lines
    titan_check(titan, lines, p, f)
    plain = plan([4, 4], tp=2, zero=3)
    assert "--compile.enable" not in torchtitan_args(plain, facts(8, kernels="eager"))


def test_an_eager_plan_priced_under_flash_first_exports_megatrons_flash_backend():
    """--sdpa-order flash-first priced FlashAttention-2 on the H100: Megatron-LM is asked for it by
    name (--attention-backend=flash), not for the cuDNN attention torch 2.15's order would run."""
    shape = {**SHAPE, TRACED_ATTENTION_KEY: "_scaled_dot_product_flash_attention causal"}
    f = facts(8, shape=shape, kernels="eager", compute_capability=9.0, sdpa_order="flash-first")
    assert megatron_attention_backend(f) == ("flash", "flash2")


@pytest.mark.parametrize(
    ("traced", "kernels", "capability", "backend"),
    [
        ("_scaled_dot_product_flash_attention causal", "megatron", 9.0, ("fused", "cudnn")),  # TE's cuDNN on Hopper
        ("_scaled_dot_product_flash_attention causal", "megatron", 8.0, ("flash", "flash2")),
        ("_scaled_dot_product_flash_attention causal", "eager", 9.0, ("fused", "cudnn")),  # torch's cuDNN first
        ("_scaled_dot_product_efficient_attention causal", "eager", 8.0, ("flash", "efficient")),  # none such
        ("_scaled_dot_product_flash_attention causal", "ops", 9.0, ("fused", None)),  # priced unfused
        ("", "megatron", 9.0, ("unfused", None)),  # eager attention: separate ops
        (None, "megatron", 9.0, None),  # not known: Megatron-LM's auto
    ],
)
def test_megatron_attention_backend_is_the_kernel_priced(traced, kernels, capability, backend, mcore):
    shape = dict(SHAPE) if traced is None else {**SHAPE, TRACED_ATTENTION_KEY: traced}
    f = facts(8, shape=shape, kernels=kernels, compute_capability=capability)
    assert megatron_attention_backend(f) == backend
    p = plan([4, 4])
    args = megatron_args(p, f)
    assert (f"--attention-backend={backend[0]}" in args) if backend else not any("attention-backend" in a for a in args)
    megatron_check(mcore, args, p, f)


def test_megatron_reads_back_every_priced_setting(mcore):
    """One plan with every setting Megatron-LM launches (TP 2 with SP and TP overlap, CP 2 and
    its ring, ZeRO 1 with both overlaps, FP8, uneven first and last stages, full recompute,
    Megatron's kernels and cuDNN attention on an H100): each is a flag, read back through
    megatron-core's configs (megatron_check)."""
    p, f = MEGATRON_PRECISION_CASES["everything"]
    args = megatron_args(p, f)
    for flag in (
        "--tensor-model-parallel-size=2",
        "--sequence-parallel",
        "--tp-comm-overlap",
        "--context-parallel-size=2",
        "--cp-comm-type=p2p",
        "--use-distributed-optimizer",
        "--overlap-grad-reduce",
        "--overlap-param-gather",
        "--fp8-format=hybrid",
        "--fp8-recipe=delayed",
        "--decoder-first-pipeline-num-layers=3",
        "--decoder-last-pipeline-num-layers=3",
        "--recompute-granularity=full",
        "--transformer-impl=transformer_engine",
        "--attention-backend=fused",
        "--attention-dropout=0.0",
        "--hidden-dropout=0.0",
        "--bf16",
    ):
        assert flag in args, flag
    assert args[-3:] == ["--tokenizer-type=HuggingFaceTokenizer", *args[-2:]] and "<REPLACE:" in args[-1]
    megatron_check(mcore, args, p, f)
    from phaze.plan.export import runtime_differences

    assert runtime_differences("megatron", p, f) == []  # priced as Megatron-LM runs


def test_a_launch_that_runs_another_runtime_is_said_once():
    """Kernels, attention and model that a target runs other than as priced: one line each,
    in the plan's JSON warnings and summary, added once however often asked."""
    from phaze.plan.export import export_warnings, runtime_differences

    efficient = {**SHAPE, TRACED_ATTENTION_KEY: "_scaled_dot_product_efficient_attention"}
    f = facts(8, shape=efficient, kernels="eager", compute_capability=8.0)
    p = plan([8], pp=1, zero=3)
    megatron = runtime_differences("megatron", p, f)
    assert len(megatron) == 2 and "--kernels eager" in megatron[0] and "efficient" in megatron[1]
    titan = runtime_differences("torchtitan", p, f)
    assert len(titan) == 1 and "FlexAttention" in titan[0]
    # Priced as Megatron-LM runs it (TE's FlashAttention-2 on an A100): nothing to say.
    assert runtime_differences("megatron", p, dataclasses.replace(f, kernels="megatron")) == []
    ops = runtime_differences("megatron", p, dataclasses.replace(f, kernels="ops"))
    assert "--kernels ops" in ops[0] and "separate ops" in ops[1]
    assert runtime_differences("torchtitan", p, facts(8, kernels="eager")) == []
    gpt2 = runtime_differences("torchtitan", p, facts(8, kernels="eager", shape=TINY_GPT2_SHAPE))
    assert len(gpt2) == 1 and "not as the model has it (activation gelu_new, normalization LayerNorm" in gpt2[0]
    p["summary"] = {"lines": ["MFU 40 %"], "warnings": []}
    requests = [("megatron", "m"), ("torchtitan", "t")]
    said = export_warnings(requests, p, f)
    assert said == megatron + titan and export_warnings(requests, p, f) == []
    assert [w["message"] for w in p["warnings"] if w["kind"] == "export-runtime"] == said
    assert p["summary"]["lines"][1:] == [f"warning: {m}" for m in said] and p["summary"]["warnings"] == said
    # A target that refuses the plan (torchtitan, ZeRO 1) says its refusal, not how it would run.
    assert all(w.startswith("--export megatron") for w in export_warnings(requests, plan([8], pp=1, zero=1), f))


def test_megatron_fp8_primary_weights_and_bf16_adam_state():
    """A plan priced with FP8 primary weights (``--fp8-params``) launches with Megatron-LM's
    ``--fp8-param-gather``; Adam with its state in bf16 (Apex's, ``--optimizer adam-bf16``)
    has no Megatron-LM flags (``--main-params-dtype`` is fp32 or fp16) and is refused."""
    p = plan([4, 4], tp=2, zero=1)
    assert "--fp8-param-gather" in megatron_args(p, facts(8, dtype="fp8", fp8_params=True))
    assert "--fp8-param-gather" not in megatron_args(p, facts(8, dtype="fp8"))
    with pytest.raises(PhazeError, match="adam-bf16"):
        megatron_args(p, facts(8, optimizer="adam-bf16"))


def test_the_gradients_are_reduced_in_the_dtype_priced():
    """``--reduce-dtype`` launches as priced: Megatron-LM reduces bf16 gradients in fp32 unless
    ``--grad-reduce-in-bf16``, fp16 ones in fp16 unless ``--accumulate-allreduce-grads-in-fp32``;
    torchtitan 0.3.0 reduces in float32 only, so a plan priced in bf16 over DP is refused."""
    p = plan([4, 4], tp=2, zero=1)
    bf16, fp16 = facts(8, dtype="bfloat16"), facts(8, dtype="amp-float16")
    assert "--grad-reduce-in-bf16" not in megatron_args(p, bf16)
    assert "--grad-reduce-in-bf16" in megatron_args(p, dataclasses.replace(bf16, reduce_dtype="bf16"))
    assert "--accumulate-allreduce-grads-in-fp32" in megatron_args(p, fp16)
    fp16_wire = dataclasses.replace(fp16, reduce_dtype="fp16")
    assert "--accumulate-allreduce-grads-in-fp32" not in megatron_args(p, fp16_wire)
    fsdp = plan([8], pp=1, zero=3)
    torchtitan_args(fsdp, bf16)
    with pytest.raises(PhazeError, match="float32 only"):
        torchtitan_args(fsdp, dataclasses.replace(bf16, reduce_dtype="bf16"))


def test_hsdp_is_torchtitans_two_dimensional_mesh(titan):
    """An HSDP plan (``--dp-shard 4`` of DP 16) is torchtitan's data_parallel_shard_degree 4 and
    data_parallel_replicate_degree 4, which torchtitan's ParallelDims accepts; Megatron-LM's
    export refuses it in one line, and a plan that is not HSDP (the shard group the whole DP
    group) is exported as FSDP."""
    p = plan([8], dp=16, pp=1, tp=1, b=1, m=1, zero=3)
    f = facts(8, dp_shard=4)
    lines = torchtitan_args(p, f)
    assert "--parallelism.data_parallel_replicate_degree=4" in lines
    assert "--parallelism.data_parallel_shard_degree=4" in lines
    titan_check(titan, lines, p, f)
    with pytest.raises(PhazeError, match=r"^--export megatron: the plan is HSDP \(--dp-shard 4"):
        megatron_args(p, f)
    whole = torchtitan_args(p, facts(8, dp_shard=16))
    assert "--parallelism.data_parallel_shard_degree=16" in whole
    assert "--parallelism.data_parallel_replicate_degree=1" in whole
