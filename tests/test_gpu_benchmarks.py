"""The GPU measurement scripts (benchmarks/gpu/) agree with the script that prices what they
measure: every configuration train_step_runtimes.py would run has a model file
price_train_step.py knows, a row of either CSV is read with its precision and runtime, and the
smoke test's shrinking gives every model two small layers. No GPU and no pricing here."""

import csv
from pathlib import Path

import pytest
from conftest import gpu_script

GPU = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"


def test_every_configuration_is_priceable():
    runtimes, price = gpu_script("train_step_runtimes"), gpu_script("price_train_step")
    for model, b, attention, recompute, precision, compiled in runtimes.CONFIGS:
        assert model in runtimes.MODEL_FILES and model in price.MODEL_FILES, model
        assert Path(runtimes.MODEL_FILES[model]) == Path(price.MODEL_FILES[model])
        assert precision in price.DTYPES
        assert attention in ("eager", "sdpa") and recompute in ("none", "full") and isinstance(compiled, bool)
        assert b >= 1


@pytest.mark.parametrize("name", ["moe_small", "llama3_1b_8k"])
def test_new_model_files_build_on_meta(name):
    import torch

    runtimes = gpu_script("train_step_runtimes")
    mod = runtimes.load(str(GPU / "models" / f"{name}.py"))
    with torch.device("meta"):
        model = mod.get_model()
    params = sum(p.numel() for p in model.parameters())
    assert {"moe_small": 428_385_280, "llama3_1b_8k": 1_235_814_400}[name] == params
    small = runtimes.tiny(mod.config())
    assert small.num_hidden_layers == 2 and small.hidden_size == 64


def test_rows_of_both_csvs_are_read_with_their_runtime(tmp_path):
    price = gpu_script("price_train_step")
    old = tmp_path / "train_step.csv"
    new = tmp_path / "train_step_runtimes.csv"
    common = {"model": "gpt2-small", "micro_batch": "8", "attention": "sdpa", "recompute": "none"}
    nums = {"step_s": "0.1", "kernel_s": "0.09", "kernels": "900", "peak_memory_bytes": "123"}
    with open(old, "w", newline="") as f:
        w = csv.DictWriter(f, [*common, *nums])
        w.writeheader()
        w.writerow({**common, **nums})
        w.writerow({**common, **nums, "step_s": "oom"})
    with open(new, "w", newline="") as f:
        w = csv.DictWriter(f, [*common, "precision", "compiled", *nums])
        w.writeheader()
        w.writerow({**common, "precision": "bf16", "compiled": "inductor", **nums})
    (a,) = price.read_measured(old)  # the oom row has no measurement
    (b,) = price.read_measured(new)
    assert (a.precision, a.compiled) == ("amp-bf16", "none")
    assert (b.precision, b.compiled) == ("bf16", "inductor")
    assert a.key != b.key and b.key[-2:] == ("bf16", "inductor")
