"""Inputs refused as the loaders mean to (issue 58, item 3): a config.json that leaves a size to
transformers' defaults (some other model's) is refused (the sequence length) or warned in one
line naming the key; phaze-validate refuses a measured time no iteration takes and a column it
does not read (with the closest known name), rather than pricing the run without it."""

from __future__ import annotations

import json
import warnings

import pytest

from phaze import validate as v
from phaze_ir.errors import PhazeError, PhazeWarning
from phaze_ir.frontend.loader import load_hf_config

LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
GPT2 = {"model_type": "gpt2", "vocab_size": 256, "n_embd": 64, "n_layer": 1, "n_head": 4}


def _load(tmp_path, config: dict):
    """The spec of ``config`` as a config.json, and the PhazeWarnings said loading it."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        spec = load_hf_config(path)
    return spec, [str(w.message) for w in said if issubclass(w.category, PhazeWarning)]


def test_no_max_position_embeddings_is_no_sequence_length_not_2048(tmp_path):
    spec, said = _load(tmp_path, {**LLAMA, "intermediate_size": 128})
    assert spec.seq_len is None and said == []
    with pytest.raises(PhazeError) as e:
        spec.inputs(1)
    assert str(e.value) == (
        "config.json: the config gives no max_position_embeddings (transformers' LlamaConfig default would be "
        "2,048): give it in the file, or --seq-len"
    )
    assert spec.inputs(1, 16)[1]["input_ids"].shape == (1, 16)  # --seq-len gives it


def test_no_sequence_length_is_refused_before_any_trace(tmp_path, monkeypatch):
    """``phazec --hw``'s compilation refuses it as it starts (the spec says why), not after
    tracing a micro-batch and compiling every point again to the same error."""
    from phaze import driver
    from phaze.options import Options
    from phaze_ir.frontend import trace

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "intermediate_size": 128}))

    def traced(*_a, **_k):
        raise AssertionError("traced before refusing")

    monkeypatch.setattr(trace, "trace_model", traced)
    opts = Options(hw="h100", devices=8, global_batch=8)
    with pytest.raises(PhazeError, match="gives no max_position_embeddings .* or --seq-len$"):
        driver.start_compilation(str(path), opts)
    assert driver.start_compilation(str(path), Options(hw="h100", devices=8, global_batch=8, seq_len=16))


def test_gpt2_without_n_positions_names_its_own_key(tmp_path):
    spec, _ = _load(tmp_path, GPT2)
    with pytest.raises(PhazeError, match=r"gives no n_positions \(transformers' GPT2Config default would be 1,024\)"):
        spec.inputs(1)
    # under the alias transformers maps to it: given
    spec, said = _load(tmp_path, {**GPT2, "max_position_embeddings": 32})
    assert spec.seq_len == 32 and said == []


def test_a_size_left_to_the_default_is_one_warning_naming_it(tmp_path):
    spec, said = _load(tmp_path, {**LLAMA, "max_position_embeddings": 32})
    assert said == [
        "config.json: no intermediate_size: priced at transformers' LlamaConfig default 11,008 (another model's "
        "size; give it in the file)"
    ]
    assert spec.seq_len == 32


def test_several_sizes_left_to_defaults_are_one_line(tmp_path):
    config = {"model_type": "mixtral", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1}
    config |= {"num_attention_heads": 8, "max_position_embeddings": 32}
    _, said = _load(tmp_path, config)
    assert len(said) == 1 and "\n" not in said[0]
    for key in ("intermediate_size", "num_key_value_heads", "num_experts_per_tok", "num_local_experts"):
        assert key in said[0]
    assert "MixtralConfig defaults 14,336, 8, 2, 8" in said[0]


def test_a_rule_of_the_config_class_is_no_default_size(tmp_path):
    """GPT-2's n_inner (None: 4 x hidden) and Llama's num_key_value_heads (None: the heads)
    are rules on the sizes given, not another model's sizes: nothing said."""
    _, said = _load(tmp_path, {**GPT2, "n_positions": 32})
    assert said == []
    _, said = _load(tmp_path, {**LLAMA, "max_position_embeddings": 32, "intermediate_size": 128})
    assert said == []


# -- phaze-validate ---------------------------------------------------------------------------

HEADER = (
    "# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
    "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)"
)
RUN = "1,2,1,64,2,2,32,1,1,1"


@pytest.mark.parametrize("ms", ["1e308", "1e-300", "2e9", "0.0005"])
def test_a_measured_time_no_iteration_takes_refuses_its_row_alone(ms):
    runs = v.parse_runs(f"{HEADER}\n{RUN},{ms}\n{RUN},10\n", "runs.csv")
    assert runs[0].refused == (
        f"'iteration time (ms)' is {float(ms):.6g}, expected a time of one iteration from 0.001 to 1e+09 ms"
    )
    assert runs[1].refused == "" and runs[1].measured_ms == 10


def test_a_copy_of_a_refused_time_is_judged_on_its_own_time():
    """Rows that differ only in their time share their first's checks, not its time's refusal."""
    runs = v.parse_runs(f"{HEADER}\n{RUN},1e308\n{RUN},12\n{RUN},1e-9\n", "runs.csv")
    assert [bool(r.refused) for r in runs] == [True, False, True]


@pytest.mark.parametrize(
    "column, says",
    [
        (
            "context parallelism",
            "runs.csv:1: unknown column 12 'context parallelism': its runs would be priced without it "
            "(docs/usage.md lists the columns phaze-validate reads)",
        ),
        ("Sequence Parallel", "unknown column 12 'Sequence Parallel' (did you mean 'sequence parallelism'?)"),
        ("kernel", "unknown column 12 'kernel' (did you mean 'kernels'?)"),
        ("vocab\x1b[31m", "unknown column 12 'vocab\x1b[31m'"),  # escaped where it is printed
    ],
)
def test_an_unknown_column_is_refused_with_the_closest_name(column, says):
    with pytest.raises(PhazeError) as e:
        v.parse_runs(f"{HEADER},{column}\n{RUN},10,2\n", "runs.csv")
    assert says in str(e.value)


def test_the_columns_known_to_be_left_aside_are_read():
    runs = v.parse_runs(f"Parameters (billion),{HEADER},\n0.1,{RUN},10,\n", "runs.csv")
    assert len(runs) == 1 and not runs[0].refused


def test_phaze_validate_says_the_refused_time_in_one_line_and_exits_3(tmp_path, capsys):
    """One row refused, the other priced: the refused row's one line, the report, exit 3."""
    from phaze.tools import phaze_validate

    csv = tmp_path / "runs.csv"
    csv.write_text(f"{HEADER}\n{RUN},1e308\n{RUN},10\n")
    assert phaze_validate.main([str(csv), "--hw", "a100", "-q", "--summary-only"]) == 3
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"phaze-validate: {csv}:2: row 1: 'iteration time (ms)' is 1e+308, expected a time of one iteration from "
        "0.001 to 1e+09 ms (refused; the other rows are priced)"
    ]
    assert max(len(word) for word in out.split()) < 40  # no 300-digit figure


def test_a_refused_row_alone_is_one_line(tmp_path, capsys, no_trace):
    """A file of one run, refused: its one line and exit 3 (was that line and "1 row refused,
    not priced (exit status 3)": two lines for one refusal); the report lists it."""
    from phaze.tools import phaze_validate

    csv = tmp_path / "runs.csv"
    csv.write_text(f"{HEADER}\n{RUN},1e-300\n")
    assert phaze_validate.main([str(csv), "--hw", "a100", "-q", "--summary-only"]) == 3
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"phaze-validate: {csv}:2: row 1: 'iteration time (ms)' is 1e-300, expected a time of one iteration from "
        "0.001 to 1e+09 ms (refused)"  # no other row to price
    ]
    assert "not priced (1; not in the figures below):" in out


# -- the cluster ------------------------------------------------------------------------------


@pytest.mark.parametrize("devices", [8192, 2_147_483_647])
def test_a_cluster_larger_than_the_hardware_file_describes_is_refused(devices):
    """The a100 file describes clusters of up to 4,096 GPUs (its last network level): 8,192 or
    2^31 - 1 devices are refused before anything is traced, not priced on a network it lacks."""
    from dataclasses import replace

    from phaze.driver import check_question
    from phaze.options import Options
    from phaze_ir.files import si_count

    with pytest.raises(PhazeError) as e:
        check_question(replace(Options(), hw="a100", devices=devices, global_batch=devices))
    assert str(e.value) == (
        f"--devices {si_count(devices)}: the a100 description holds at most 4,096 devices (its last network level's "
        "group_size, 'cluster'); give a hardware file with a larger one"
    )
    check_question(replace(Options(), hw="a100", devices=4096))  # the largest it describes
