"""The published multi-GPU runs (data/published/multi_gpu_runs.csv) and the benchmark that prices
them (benchmarks/price_published.py): the file parses, every row says where its numbers are, and
a row maps to the phazec flags that price it as it ran.  Nothing here runs phazec."""

import csv
import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "data" / "published" / "multi_gpu_runs.csv"


def _load():
    spec = importlib.util.spec_from_file_location("price_published", ROOT / "benchmarks" / "price_published.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["price_published"] = mod
    spec.loader.exec_module(mod)
    return mod


pp = _load()


def _flag(flags, name):
    return flags[flags.index(name) + 1]


def test_the_file_parses_and_every_row_has_a_source():
    rows = pp.read_rows(CSV)
    assert len(rows) == 95
    assert {r.group for r in rows} == {"fsdp", "megatron", "nemo", "dgxc"}
    assert sum(pp.chip_name(r.hw) == "h100" for r in rows) == 58
    assert sum(pp.chip_name(r.hw) == "h100_hbm2e" for r in rows) == 15
    assert len({r.id for r in rows}) == len(rows)
    for r in rows:
        assert r.source.startswith(("https://", "Korthikanti")), r.id
        assert r.where and r.date, r.id
        assert r.measured > 0 and r.measured_step_s > 0
        if r.model.startswith("gpt:"):
            pp.gpt_shape(r.model)
        elif r.model.startswith("fms:"):
            pp.fms_variant(r.model)
        else:
            assert (ROOT / "examples" / f"{r.model}.py").is_file(), r.id
    with open(CSV, newline="", encoding="utf-8") as f:
        assert set(pp.REQUIRED) <= set(next(csv.reader(f)))


def test_tokens_per_second_become_the_step_time():
    r = {x.id: x for x in pp.read_rows(CSV)}["fms-7b"]
    # 256 sequences of 4096 tokens over 128 GPUs at 3760 tokens/s each
    assert r.measured_step_s == pytest.approx(256 * 4096 / (3760 * 128))
    assert r.tokens_per_s_per_gpu(r.measured_step_s) == pytest.approx(3760)


def test_an_hsdp_row_shards_in_a_node():
    """fms-fsdp's 7B ran HYBRID_SHARD over the 8 GPUs of a node: ``--dp-shard 8``, ZeRO-3; a
    shard group that does not divide DP is refused in one line."""
    r = {x.id: x for x in pp.read_rows(CSV)}["fms-7b"]
    f = pp.phazec_flags(r)
    assert (_flag(f, "--dp-shard"), _flag(f, "--zero")) == ("8", "3")
    d = {k: "1" for k in pp.REQUIRED} | {"dp": "8", "gpus": "8", "zero": "3", "global_batch": "8"}
    d.update(precision="bf16", recompute="none", measured_unit="tokens/s/gpu", sequence_parallel="off")
    d.update(tp_overlap="off", dp_overlap="off", sharding="hsdp:8")
    assert pp.parse_row(d, "row").sharding == "hsdp:8"
    d["sharding"] = "hsdp:3"
    with pytest.raises(ValueError, match=r"^row: sharding 'hsdp:3', expected hsdp:N with N dividing DP x CP"):
        pp.parse_row(d, "row")


def test_an_fsdp_row_maps_to_zero3_with_overlap_eager_kernels_and_bf16():
    r = {x.id: x for x in pp.read_rows(CSV)}["fms-70b"]
    f = pp.phazec_flags(r)
    assert _flag(f, "--hw") == "data/clusters/aws_p4de.toml"  # fms-fsdp's AWS cluster
    assert "--dp-shard" not in f  # FSDP over all 128
    assert _flag(f, "--devices") == "128"
    assert _flag(f, "--placement") == "expert:1,128,1"
    assert _flag(f, "--tp") == "1"
    assert _flag(f, "--micro-batch") == "6"
    assert _flag(f, "--global-batch") == "768"
    assert _flag(f, "--seq-len") == "4096"
    assert _flag(f, "--zero") == "3"
    assert "--dp-overlap" in f
    assert _flag(f, "--recompute") == "full"
    assert _flag(f, "--dtype") == "bfloat16"
    assert _flag(f, "--kernels") == "eager"
    assert "--pipeline-transfer" not in f
    bound = pp.phazec_flags(r, dp_overlap=False)  # the bound with FSDP's collectives exposed
    assert "--dp-overlap" not in bound and "--no-dp-overlap" in bound  # (phazec's default overlaps)


def test_fms_fsdp_rows_pay_fsdp1s_copies_and_torchtitans_fsdp2s():
    """fms-fsdp ran torch's FullyShardedDataParallel, torchtitan its fully_shard: each row's
    --fsdp-version says whose copies it pays (docs/design.md §6.5); an empty column is 2, and
    any other value is refused in one line."""
    rows = pp.read_rows(CSV)
    versions = {r.id: _flag(pp.phazec_flags(r), "--fsdp-version") for r in rows}
    assert {v for k, v in versions.items() if k.startswith("fms-")} == {"1"}
    assert {v for k, v in versions.items() if not k.startswith("fms-")} == {"2"}
    d = {k: "1" for k in pp.REQUIRED} | {"precision": "bf16", "recompute": "none", "measured_unit": "tokens/s/gpu"}
    d.update(sequence_parallel="off", tp_overlap="off", dp_overlap="off", sharding="fsdp", fsdp="3")
    with pytest.raises(ValueError, match=r"^row: fsdp '3', expected one of 2, 1$"):
        pp.parse_row(d, "row")


def test_torchtitans_selective_checkpointing_is_priced_as_it_ran():
    """torchtitan's layer policy (every second block) and op policy are phaze's selective
    recompute with what torchtitan re-runs; Megatron's selective runs its attention core."""
    rows = {x.id: x for x in pp.read_rows(CSV)}
    for rid, what in (("tt-l3-8b-sel-layer", "layer:2"), ("tt-l3-8b-sel-op", "op"), ("tt-l2-70b-sel-op", "op")):
        flags = pp.phazec_flags(rows[rid])
        assert (_flag(flags, "--recompute"), _flag(flags, "--selective-recompute")) == ("selective", what)
        assert rows[rid].exact
    assert _flag(pp.phazec_flags(rows["k22-175b-sp-sel"]), "--selective-recompute") == "attention"
    assert rows["tt-l2-70b-full"].exact


def test_a_torchtitan_float8_row_names_its_scaling():
    """torchtitan's float8 converter (torchao's Float8Linear) scales per tensor or per row:
    ``--fp8-recipe tensorwise|rowwise``; Transformer Engine's ``fp8`` rows leave phazec its own
    recipe for their kernels. The rows are FSDP x TP on the 96 GB HBM2e part, async TP as
    ``--tp-overlap on``, and an FP8 regime."""
    rows = {x.id: x for x in pp.read_rows(CSV)}
    tw, rw = rows["tt25-l3-70b-fp8tw-asynctp"], rows["tt25-l3-8b-fp8rw-tp"]
    f = pp.phazec_flags(tw)
    assert (_flag(f, "--dtype"), _flag(f, "--fp8-recipe")) == ("fp8", "tensorwise")
    assert (_flag(f, "--hw"), _flag(f, "--placement"), _flag(f, "--zero")) == ("h100_hbm2e", "expert:1,32,8", "3")
    assert (_flag(f, "--tp-overlap"), _flag(f, "--sequence-parallel")) == ("on", "on")
    assert _flag(f, "--kernels") == "inductor"
    assert _flag(pp.phazec_flags(rw), "--fp8-recipe") == "rowwise"
    assert _flag(pp.phazec_flags(rw), "--selective-recompute") == "op"
    assert "--fp8-recipe" not in pp.phazec_flags(rows["nemo-l3-70b-cp2"])
    assert pp.row_regime(tw).precision == "fp8" and pp.row_regime(rows["tt25-l3-70b-bf16-tp"]).precision == "16-bit"
    # 16 sequences of 8192 tokens a DP rank, 32 ranks, 256 GPUs at 942.4 tokens/s each
    assert tw.measured_step_s == pytest.approx(16 * 32 * 8192 / (942.4 * 256))


def test_a_megatron_row_maps_to_its_parallelism_and_megatron_kernels():
    r = {x.id: x for x in pp.read_rows(CSV)}["k22-175b-sp-sel"]
    f = pp.phazec_flags(r)
    assert _flag(f, "--placement") == "expert:8,1,8"
    assert _flag(f, "--tp") == "8"
    assert _flag(f, "--zero") == "0"
    assert "--dp-overlap" not in f
    assert _flag(f, "--recompute") == "selective"
    assert _flag(f, "--sequence-parallel") == "on"
    assert _flag(f, "--pipeline-schedule") == "interleaved:3"
    assert _flag(f, "--pipeline-transfer") == "split"
    assert _flag(f, "--kernels") == "megatron"
    assert _flag(f, "--dtype") == "float16"
    assert r.measured_step_s == 13.75


def test_a_nemo_row_maps_to_fp8_context_parallelism_and_tp_overlap():
    """NeMo 24.07's Llama 3 70B on 64 H100s: TP 4 x CP 2 x PP 4 (VP 5) x DP 2, FP8, sequence
    parallelism with TE's userbuffers overlap, the distributed Adam overlapped."""
    r = {x.id: x for x in pp.read_rows(CSV)}["nemo-l3-70b-cp2"]
    f = pp.phazec_flags(r)
    assert _flag(f, "--hw") == "h100"
    assert _flag(f, "--devices") == "64"
    assert _flag(f, "--placement") == "expert:4,2,4"  # PP, DP, TP; CP apart
    assert _flag(f, "--context-parallel") == "2"
    assert _flag(f, "--tp-overlap") == "on"
    assert _flag(f, "--sequence-parallel") == "on"
    assert _flag(f, "--pipeline-schedule") == "interleaved:5"
    assert _flag(f, "--dtype") == "fp8"
    assert _flag(f, "--kernels") == "megatron"
    assert _flag(f, "--zero") == "1"
    assert "--dp-overlap" in f
    assert "--pipeline-transfer" not in f
    # 128 sequences of 8192 tokens over 64 GPUs at 1524 tokens/s each
    assert r.measured_step_s == pytest.approx(128 * 8192 / (1524 * 64))
    cp8 = {x.id: x for x in pp.read_rows(CSV)}["nemo-l3-8b-cp2"]
    assert _flag(pp.phazec_flags(cp8), "--placement") == "expert:1,4,1"
    assert _flag(pp.phazec_flags(cp8), "--tp-overlap") == "off"
    # a row without CP or TP overlap prices as before
    k22 = pp.phazec_flags({x.id: x for x in pp.read_rows(CSV)}["k22-175b-sp-sel"])
    assert (_flag(k22, "--context-parallel"), _flag(k22, "--tp-overlap")) == ("1", "off")


def test_model_files(tmp_path):
    rows = {x.id: x for x in pp.read_rows(CSV)}
    sdpa = Path(pp.model_file(rows["tt-l3-70b-full"], tmp_path))
    text = sdpa.read_text()
    assert "set_attn_implementation('sdpa')" in text and "llama3_70b.py" in text
    gpt = Path(pp.model_file(rows["k22-22b-full"], tmp_path))
    assert "n_embd=6144" in gpt.read_text() and "n_positions=2048" in gpt.read_text()
    fms = Path(pp.model_file(rows["fms-h100-70b-eager"], tmp_path))
    assert fms.name == "fms_llama_70b.py" and "get_model('70b')" in fms.read_text()
    with pytest.raises(ValueError, match="expected fms:VARIANT"):
        pp.fms_variant("fms:8b")
    eager = dataclasses.replace(rows["fms-h100-7b-eager"], attention="eager")
    with pytest.raises(ValueError, match="runs SDPA attention"):
        pp.model_file(eager, tmp_path)


def test_a_bad_row_is_refused():
    d = {k: "1" for k in pp.REQUIRED}
    d.update(precision="bf16", recompute="none", measured_unit="tokens/s/gpu", sequence_parallel="off", gpus="4")
    d.update(tp_overlap="off", dp_overlap="off")
    with pytest.raises(ValueError, match="TP x PP x DP"):
        pp.parse_row(d, "row")
    d.update(gpus="1", source="")
    with pytest.raises(ValueError, match="empty source"):
        pp.parse_row(d, "row")
    d.update(source="x", gpus="2", cp="2")
    assert pp.parse_row(d, "row").cp == 2
    with pytest.raises(ValueError, match="TP x PP x DP x CP"):
        pp.parse_row({**d, "cp": "4"}, "row")
    with pytest.raises(ValueError, match="needs sequence_parallel on"):
        pp.parse_row({**d, "tp_overlap": "on"}, "row")
    assert pp.recompute_flags(pp.parse_row({**d, "recompute": "selective-share:0.69"}, "row").recompute) == (
        "selective",
        "share:0.69",
    )
    with pytest.raises(ValueError, match=r"^row: recompute 'selective-share:1.5': expected attention, op"):
        pp.parse_row({**d, "recompute": "selective-share:1.5"}, "row")
    with pytest.raises(ValueError, match=r"^row: recompute 'sel', expected one of none, full, .* or selective-share:P"):
        pp.parse_row({**d, "recompute": "sel"}, "row")
    # a file written before the cp and tp_overlap columns: one device of CP, no TP overlap
    old = pp.parse_row({k: v for k, v in d.items() if k not in ("cp", "tp_overlap")} | {"gpus": "1"}, "row")
    assert (old.cp, old.tp_overlap) == (1, "off")


def test_the_h100_rows_map_to_their_flags(tmp_path):
    """The DGX Cloud recipes' Llama 3.1 405B: TP 8 x PP 9 (VP 7) x CP 2 x DP 4 on 576 GPUs;
    fms-fsdp's compiled H100 runs priced with inductor's kernels; NeMo's GPT-3 as Megatron's GPT
    with its attention switched to SDPA."""
    rows = {x.id: x for x in pp.read_rows(CSV)}
    f = pp.phazec_flags(rows["dgxc-l31-405b-bf16-576"])
    assert _flag(f, "--placement") == "expert:9,4,8"
    assert (_flag(f, "--context-parallel"), _flag(f, "--pipeline-schedule")) == ("2", "interleaved:7")
    assert (_flag(f, "--global-batch"), _flag(f, "--expert-parallel")) == ("252", "1")
    assert rows["dgxc-l31-405b-bf16-576"].measured_step_s == 17.20
    fms = pp.phazec_flags(rows["fms-h100-70b-compile"])
    assert (_flag(fms, "--kernels"), _flag(fms, "--zero"), _flag(fms, "--selective-recompute")) == (
        "inductor",
        "3",
        "share:0.69",  # fms-fsdp's share of the blocks its MFU and HFU imply
    )
    assert rows["fms-h100-70b-compile"].measured_step_s == pytest.approx(192 * 4096 / (890 * 96))
    gpt = Path(pp.model_file(rows["nemo-gpt3-20b"], tmp_path)).read_text()
    assert "set_attn_implementation('sdpa')" in gpt and "gpt-h6144-a48-l44" in gpt
    assert "sdpa" not in Path(pp.model_file(rows["k22-22b-full"], tmp_path)).read_text()


def test_the_runs_optimizer_state_and_fp8_weights_are_priced_as_configured():
    """The Nemotron-4 340B runs' distributed Adam kept its state in bf16 (``optim.dtype: bf16``:
    ``--optimizer adam-bf16``); the recipes' FP8 runs kept FP8 primary weights (``fp8_params``:
    ``--fp8-params``); the rest, and every file written before the columns, Adam in fp32 and
    bf16 weights; fms-fsdp's AdamW ran torch's default foreach step. A bad value, or FP8 weights in
    a run that was not FP8, is refused."""
    rows = {x.id: x for x in pp.read_rows(CSV)}
    bf16_state = {i for i, r in rows.items() if r.optimizer == "adam-bf16"}
    assert bf16_state == {f"dgxc-n4-340b-{p}-{n}" for p in ("bf16", "fp8") for n in (128, 2048)} | {"nemo-n4-340b"}
    fp8_params = {i for i, r in rows.items() if r.fp8_params == "yes"}
    assert fp8_params and all(i.startswith("dgxc-") and rows[i].precision == "fp8" for i in fp8_params)
    f = pp.phazec_flags(rows["dgxc-n4-340b-fp8-128"])
    assert _flag(f, "--optimizer") == "adam-bf16" and "--fp8-params" in f
    f = pp.phazec_flags(rows["dgxc-n4-340b-bf16-128"])
    assert _flag(f, "--optimizer") == "adam-bf16" and "--fp8-params" not in f
    # fms-fsdp's optim.AdamW without fused=True: torch's foreach step; the other rows as before
    assert {i for i, r in rows.items() if r.optimizer == "adam-foreach"} == {i for i in rows if i.startswith("fms-")}
    assert _flag(pp.phazec_flags(rows["fms-7b"]), "--optimizer") == "adam-foreach"
    assert _flag(pp.phazec_flags(rows["tt-l3-8b-sel-op"]), "--optimizer") == "adam"
    d = {k: "1" for k in pp.REQUIRED}
    d.update(precision="bf16", recompute="none", measured_unit="tokens/s/gpu", sequence_parallel="off")
    d.update(tp_overlap="off", dp_overlap="off")
    assert (pp.parse_row(d, "row").optimizer, pp.parse_row(d, "row").fp8_params) == ("adam", "no")
    with pytest.raises(ValueError, match="optimizer 'lion'"):
        pp.parse_row({**d, "optimizer": "lion"}, "row")
    with pytest.raises(ValueError, match="fp8_params yes needs precision fp8"):
        pp.parse_row({**d, "fp8_params": "yes"}, "row")


def test_the_runs_gradients_are_reduced_in_the_dtype_their_framework_used():
    """fms-fsdp's FSDP policy reduces in bf16 (``bfSixteen``), torchtitan's FSDP2 in fp32
    (``reduce_dtype=torch.float32``), Megatron-LM --fp16 in fp16, NeMo 24.07's distributed Adam
    in its fp32 state's dtype unless ``grad_sync_dtype: bf16`` (Nemotron-4 340B, and every
    dgxc-benchmarking config); a file written before the column reduces in fp32 (phazec's
    default), and a bad value is refused."""
    rows = {x.id: x for x in pp.read_rows(CSV)}
    by = {i: r.reduce_dtype for i, r in rows.items()}
    assert {by[i] for i in rows if i.startswith("fms-")} == {"bf16"}
    assert {by[i] for i in rows if i.startswith("tt-")} == {"fp32"}
    assert {by[i] for i in rows if i.startswith("k22-")} == {"fp16"}
    assert {by[i] for i in rows if i.startswith("dgxc-")} == {"bf16"}
    assert {i for i in rows if i.startswith("nemo-") and by[i] == "bf16"} == {"nemo-n4-340b"}
    assert _flag(pp.phazec_flags(rows["fms-7b"]), "--reduce-dtype") == "bf16"
    assert _flag(pp.phazec_flags(rows["tt-l3-8b-sel-op"]), "--reduce-dtype") == "fp32"
    d = {k: "1" for k in pp.REQUIRED}
    d.update(precision="bf16", recompute="none", measured_unit="tokens/s/gpu", sequence_parallel="off")
    d.update(tp_overlap="off", dp_overlap="off")
    assert pp.parse_row(d, "row").reduce_dtype == "fp32"
    with pytest.raises(ValueError, match="reduce_dtype 'fp8', expected one of fp32, bf16, fp16"):
        pp.parse_row({**d, "reduce_dtype": "fp8"}, "row")


def test_bands_are_not_written_from_failed_rows(tmp_path, capsys):
    """A run whose rows crashed (not refused for memory) leaves the band table as it was: every
    plan of their regimes would otherwise say no published run was priced."""
    path = tmp_path / "bands.json"
    path.write_text("old\n")
    assert pp.write_bands(path, {"regimes": {}}, {"a": ("priced", 0.1), "b": ("failed", None)}) == 1
    assert path.read_text() == "old\n" and "1 rows failed (b" in capsys.readouterr().err
    assert pp.write_bands(path, {"regimes": {}}, {"a": ("priced", 0.1), "b": ("refused", None)}) == 0
    assert path.read_text().startswith("{") and not (tmp_path / "bands.json.tmp").exists()


def test_megatron_tflops_become_the_step_time():
    """NeMo's long-sequence rows give Megatron-LM's model TFLOP/s per GPU; its formula counts
    the attention's whole square, as NeMo 24.07's Llama 2 7B row shows (780 TFLOP/s at 16,934
    tokens/s per GPU)."""
    rows = {x.id: x for x in pp.read_rows(CSV)}
    short = rows["nemo-l2-7b"]
    per_token = pp.megatron_model_flops(short) / (short.global_batch * short.seq_len)
    assert per_token == pytest.approx(780e12 / 16934, rel=1e-3)
    long = rows["nemo-ls-l2-7b-128k"]
    assert (long.gpus, long.cp, long.seq_len, long.global_batch) == (128, 4, 131072, 32)
    h, layers, s = 4096, 32, 131072  # Llama 2 7B: the attention term s/h is 32 of the 38.2
    terms = (1 + 1 + s / h) + (11008 / h) * 1.5 + 32000 / (2 * layers * h)
    assert long.measured_step_s == pytest.approx(12 * 32 * s * layers * h * h * terms / (555e12 * 128))


def test_torchaos_rowwise_table_covers_its_grid_and_the_benchmarks_shapes():
    """``torchao_float8_rowwise_linear_h100.csv``: every (M, K, N) of 1,024 … 32,768 once, each
    a positive speed-up; ``benchmarks/fp8_linear_shapes.py`` reads it and its default shapes
    are in it (it prints torchao's figure beside phaze's)."""
    spec = importlib.util.spec_from_file_location("fp8_linear_shapes", ROOT / "benchmarks" / "fp8_linear_shapes.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    table = mod.published()
    sizes = [1024 * 2**i for i in range(6)]
    assert sorted(table) == sorted((m, k, n) for m in sizes for k in sizes for n in sizes)
    assert all(0 < v < 2 for v in table.values())
    assert set(mod.DEFAULT_SHAPES) <= set(table)
    # the figures quoted in docs/validation.md
    assert table[16384, 4096, 1024] == 0.57 and table[16384, 8192, 8192] == 1.33


def test_the_deepseek_v3_row_runs_as_the_recipe_laid_it_out():
    """DeepSeek-V3 671B on 1,024 H100s (dgxc-benchmarking v25.08.01): TP 1, PP 8 × VP 2 over
    its 61 blocks (NeMo's uneven layout, which phaze's interleaved split now takes), EP 64 folded
    over DP 128, dropless, full recompute standing for the recipe's recompute modules."""
    rows = {x.id: x for x in pp.read_rows(CSV)}
    f = pp.phazec_flags(rows["dgxc-dsv3-671b-bf16-1024"])
    assert _flag(f, "--placement") == "expert:8,128,1"
    assert (_flag(f, "--expert-parallel"), _flag(f, "--pipeline-schedule")) == ("64", "interleaved:2")
    assert _flag(f, "--recompute") == "full" and "--capacity-factor" not in f
    assert rows["dgxc-dsv3-671b-bf16-1024"].model == "deepseek_v3_671b"


def test_the_grok1_rows_run_expert_parallelism_over_context_parallelism_at_capacity():
    """The DGX Cloud recipes' Grok-1 314B (64 layers, 8 experts): TP 4 × PP 8 (VP 8) × CP 2 ×
    DP 8 on 512 GPUs with EP 8 (dividing the attention's DP, as Megatron-core 0.9 requires),
    the experts' inputs padded to capacity factor 1; the MoE rows alone have an EP above 1 or a
    capacity factor, and a capacity factor on a dense row is refused."""
    rows = {x.id: x for x in pp.read_rows(CSV)}
    f = pp.phazec_flags(rows["dgxc-grok1-314b-bf16-512"])
    assert _flag(f, "--placement") == "expert:8,8,4"
    assert (_flag(f, "--context-parallel"), _flag(f, "--expert-parallel")) == ("2", "8")
    assert (_flag(f, "--capacity-factor"), _flag(f, "--pipeline-schedule")) == ("1", "interleaved:8")
    fp8 = rows["dgxc-grok1-314b-fp8-2048"]
    assert fp8.dp == 32 and "--fp8-params" in pp.phazec_flags(fp8)
    moe = {i for i, r in rows.items() if r.moe == "yes"}
    grok = {f"dgxc-grok1-314b-{p}-{n}" for p in ("bf16", "fp8") for n in (512, 2048)}
    assert moe == grok | {"dgxc-dsv3-671b-bf16-1024"}
    assert {i for i, r in rows.items() if r.ep > 1 or r.capacity_factor is not None} == moe
    assert "--capacity-factor" not in pp.phazec_flags(rows["fms-7b"])
    d = {k: "1" for k in pp.REQUIRED}
    d.update(precision="bf16", recompute="none", measured_unit="tokens/s/gpu", sequence_parallel="off")
    d.update(tp_overlap="off", dp_overlap="off")
    with pytest.raises(ValueError, match="capacity_factor 1.0 needs moe yes"):
        pp.parse_row({**d, "capacity_factor": "1.0"}, "row")


def test_fms_fsdps_rows_run_flash_attention_2_and_the_others_todays_order(tmp_path):
    """fms-fsdp's README: "SDPA implementation of Flash attention v2" (the torch of 2024, before
    cuDNN came first on an H100): its rows ask --sdpa-order flash-first, with transformers' SDPA
    model file; a row of plain ``sdpa`` asks nothing (phazec's default order)."""
    rows = {x.id: x for x in pp.read_rows(CSV)}
    fms = [r for r in rows.values() if r.id.startswith("fms-")]
    assert len(fms) == 16 and all(_flag(pp.phazec_flags(r), "--sdpa-order") == "flash-first" for r in fms)
    assert all(r.model.startswith("fms:") for r in fms)  # fms's own LLaMA, its SDPA as it ran
    assert pp.model_file(rows["fms-h100-7b-eager"], tmp_path).endswith("fms_llama_7b.py")
    assert "--sdpa-order" not in pp.phazec_flags(rows["dgxc-l31-8b-bf16-8"])


def test_the_megatron_rows_run_the_attention_their_scripts_set():
    """NVTE_FUSED_ATTN=0 leaves Transformer Engine flash-attn's FlashAttention-2: NeMo's launcher
    set it for every job of its tags 24.01 to 24.07 (launcher_scripts/conf/config.yaml env_vars:
    the 24.03.01 container's long-sequence runs, and the 24.07 performance table's 12 rows, whose
    settings are the launcher's at 24.07), as do dgxc-benchmarking's grok1/configure.sh,
    nemo_megatron/launch.sh and nemotron/configure.sh for the 340B; its llama3.1 recipes and the
    Nemotron-4 15B set NVTE_FUSED_ATTN=1 (cuDNN's)."""
    rows = pp.read_rows(CSV)
    flash = {r.id for r in rows if r.kernels == "megatron" and "flash-first" in pp.phazec_flags(r)}
    assert {r.id for r in rows if r.id.startswith("nemo-ls-")} <= flash
    assert {r.id for r in rows if r.id.startswith(("dgxc-grok1-", "dgxc-gpt3-175b-", "dgxc-n4-340b-"))} <= flash
    launcher_24_07 = {r.id for r in rows if r.id.startswith("nemo-") and "tag 24.07 (8325688d)" in r.where}
    assert len(launcher_24_07) == 12 and launcher_24_07 <= flash
    assert len(flash) == 9 + 12 + 12
    assert not {r.id for r in rows if r.id.startswith(("dgxc-l31-", "dgxc-n4-15b-"))} & flash


def test_an_unknown_sdpa_order_is_refused_in_one_line():
    d = next(csv.DictReader(CSV.open(encoding="utf-8")))
    with pytest.raises(ValueError, match=r"^here: attention 'sdpa:math-first', expected sdpa:ORDER with ORDER one of"):
        pp.parse_row({**d, "attention": "sdpa:math-first"}, "here")
