"""A setting's layer energies are the compiled step's, to the last bit (issue 56).

The ``--hw`` sweep prices a power-limited step from its settings' layer energies
(``phaze.search.objective.Objective.layers``) and then compiles the winner, whose
``phaze-estimate-energy`` writes ``phaze.layer_energy`` that ``phaze-estimate-power`` lengthens
the step by; the two must agree exactly (``phaze.search.sweep.PricingMismatch``).  Under PyTorch's
kernels the selective policy is torchtitan's per-op one (``runtime_defaults``): the energy pass
priced Megatron's attention core instead (Mistral 7B: 12 % of the step), the space summed the
ops pairwise and a fitted GEMM's parts after the share (last bits)."""

from __future__ import annotations

import json

import pytest

from phaze_ir import keys

pytestmark = pytest.mark.filterwarnings("ignore")

#: a small Mistral: grouped-query attention and a sliding window shorter than the sequence
SMALL_MISTRAL = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_act": "silu",
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "vocab_size": 1024,
    "max_position_embeddings": 2048,
    "sliding_window": 512,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize(
    ("hw", "selective"),
    [("h100", "op"), ("h100", "attention"), ("h100_hbm2e", "attention")],
    ids=["h100-op", "h100-attention", "h100_hbm2e-attention"],  # 500 W: most ops at a lowered clock
)
def test_a_settings_layer_energies_are_the_compiled_steps(tmp_path, hw, selective):
    from phaze.api import options
    from phaze.driver import with_runtime_attention
    from phaze.pipeline import compile_from, load_accelerator, training_step
    from phaze.search.engine import Candidates
    from phaze.search.objective import Objective
    from phaze.search.setting import prepare_points
    from phaze_ir.attributes import LayerEnergyAttr
    from phaze_ir.frontend import load_model_file, trace_model

    path = tmp_path / "config.json"
    path.write_text(json.dumps(SMALL_MISTRAL))
    opts = options(hw, selective_recompute=selective, micro_batch=1, tp=1)
    assert opts.kernels == "eager"
    acc = load_accelerator(hw)
    (setting,), errors, _ = prepare_points(str(path), 1, (1,), opts, accelerator=acc)
    assert errors == []

    spec = with_runtime_attention(load_model_file(str(path)), opts)
    traced = trace_model(spec, 1, opts.seq_len, training=True, dtype=opts.dtype, fp8_recipe=opts.fp8)
    module = compile_from(training_step(traced, opts, acc), "training", "latency", 1, opts, verify=False)
    records = [r.as_dict() for r in keys.require_records(module, keys.LAYER_ENERGY, LayerEnergyAttr)]

    cands = Candidates.of_accelerator(acc)
    fwd, bwd, opt, sel, net = (a[:, 0] for a in Objective("throughput", cands, 8, True).layers(setting))
    assert len(records) == len(setting.layers) == 6  # embedding, 4 blocks, head
    assert any(s > 0 for s in sel)
    for i, r in enumerate(records):
        ours = [float(x[i]) for x in (fwd, bwd, opt, sel, net)]
        theirs = [float(r[f]) for f in ("fwd_j", "bwd_j", "opt_j", "selective_j", "network_j")]
        assert ours == theirs, f"layer {i}"
