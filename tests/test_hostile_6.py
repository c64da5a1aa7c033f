"""A fourth hostile round (issue 58's classes, session 62): each probe that failed, kept as the
test of what it checks. An output named with a trailing slash or as '' (a file made without the
slash; no output and no word), ``--help``/``--version`` on a full device (argparse drops the
write's error: exit 0), a pipeline spec xDSL cannot parse (five lines) or a pass option of the
wrong type (named by neither pass nor option), a model file that is a FIFO (the cache's digest
of it waited for a writer for ever), a placement option the traced step cannot take (a
traceback from the sweep), and config.json values transformers takes but cannot build from."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys

import pytest
from conftest import MODELS, ROOT

from phaze_ir.errors import PhazeError

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 256,
    "max_position_embeddings": 128,
}  # fmt: skip


def one_line(err: str) -> str:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


# --- outputs -------------------------------------------------------------------------------


def test_an_output_named_with_a_trailing_slash_is_refused_and_nothing_made(tmp_path, capsys):
    from phaze.tools import phaze_opt

    src = tmp_path / "in.mlir"
    src.write_text("builtin.module {}\n")
    rc = phaze_opt.main([str(src), "-o", f"{tmp_path}/out/"])
    line = one_line(capsys.readouterr().err)
    assert rc == 1 and line.endswith("out/: names a directory (it ends in /), expected a file name"), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.mlir"]  # no file 'out' made


@pytest.mark.parametrize("flag", ["-o", "--json", "--report"])
def test_an_output_named_as_the_empty_string_is_refused_not_skipped(flag):
    from phaze.outputs import refuse_clashes

    with pytest.raises(PhazeError, match=rf"^{flag} '': expected a file name$"):
        refuse_clashes([("the model file", "m.py")], [("-o", None), (flag, "")])


@root_only
@pytest.mark.parametrize("tool", ["phazec", "phaze_opt", "phaze_validate"])
@pytest.mark.parametrize("flag", ["--help", "--version"])
def test_help_and_version_on_a_full_device_are_an_error(tmp_path, tool, flag):
    full = tmp_path / "full"
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))  # /dev/full's numbers
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(full, "w") as out:
        r = subprocess.run([sys.executable, "-m", f"phaze.tools.{tool}", flag], stdout=out, stderr=subprocess.PIPE,
                           text=True, env=env, cwd=ROOT, timeout=120)  # fmt: skip
    assert r.returncode == 1, r.stderr
    assert "No space left on device" in one_line(r.stderr)
    assert stat.S_ISCHR(os.stat(full).st_mode)


# --- phaze-opt's pipeline spec ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("phaze-place-devices{placement=expert:1,4,1}", "unknown token at column 37 (':1,4,1}')"),
        ("phaze-place-devices{pipeline_schedule=interleaved:2}", "unknown token at column 50"),
        ("phaze-form-kernels{runtime=\x1b[31m}", "at column 28 ('\\x1b[31m}')"),
        ("phaze-\u202eplace-devices", "at column 7 ('\\u202eplace-devices')"),
    ],
    ids=["colon-in-a-value", "colon-in-a-schedule", "escape-code", "bidi-override"],
)
def test_a_pipeline_spec_that_cannot_be_parsed_is_one_escaped_line(tmp_path, capsys, spec, says):
    from phaze.tools import phaze_opt

    src = tmp_path / "in.mlir"
    src.write_text("builtin.module {}\n")
    rc = phaze_opt.main([str(src), "-p", spec])
    line = one_line(capsys.readouterr().err)
    assert rc == 1 and line.startswith("phaze-opt: error: -p '"), line
    assert says in line and 'is quoted: NAME{OPTION="a:b,c"}' in line, line
    assert "\x1b" not in line and "\u202e" not in line


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("phaze-place-devices{zero=3}", 'phaze-place-devices: zero=3: expected a string (quote it: zero="3")'),
        ("phaze-place-devices{expert_parallel=2}", "phaze-place-devices: expert_parallel=2: expected a string (quote"),
        ("phaze-place-devices{devices=8.5}", "phaze-place-devices: devices=8.5: expected an integer"),
        ('phaze-place-devices{devices="8"}', 'phaze-place-devices: devices="8": expected an integer'),
        ("phaze-place-devices{memory_headroom=nan}", "phaze-place-devices: memory_headroom=nan: expected a number"),
        ("phaze-place-devices{dp_overlap=2}", "phaze-place-devices: dp_overlap=2: expected true or false"),
        ("phaze-schedule-ops{time_limit=true}", "phaze-schedule-ops: time_limit=true: expected a number"),
        ("phaze-form-kernels{runtime=1}", 'phaze-form-kernels: runtime=1: expected a string (quote it: runtime="1")'),
    ],
)
def test_a_pass_option_of_the_wrong_type_names_the_pass_and_the_option(tmp_path, capsys, spec, says):
    from phaze.tools import phaze_opt

    src = tmp_path / "in.mlir"
    src.write_text("builtin.module {}\n")
    rc = phaze_opt.main([str(src), "-p", spec])
    line = one_line(capsys.readouterr().err)
    assert rc == 1 and line.startswith(f"phaze-opt: error: {says}"), line


def test_quoted_pass_options_are_taken(tmp_path):
    from phaze.tools.phaze_opt import ALL_PASSES, check_pipeline_spec

    check_pipeline_spec('phaze-place-devices{placement="expert:1,8,1" zero="1" devices=8},phaze-mark-saved', {})
    check_pipeline_spec("phaze-insert-recompute{time_limit=2 seed=1},phaze-form-kernels{runtime=ops}", {})
    assert "phaze-place-devices" in ALL_PASSES


# --- model files ---------------------------------------------------------------------------


def test_a_model_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path, capsys):
    """The cache keys a model by its bytes: reading a FIFO waited for a writer for ever."""
    from phaze.tools import phazec

    fifo = tmp_path / "model.py"
    os.mkfifo(fifo)
    rc = phazec.main([str(fifo), "--hw", "h100", "--cache", str(tmp_path / "cache"), "-q"])
    line = one_line(capsys.readouterr().err)
    assert rc == 1 and line == f"phazec: error: {fifo}: is not a regular file, expected a MODEL.py file", line


@root_only
def test_a_model_file_that_is_a_device_is_refused(tmp_path):
    from phaze_ir.frontend.loader import load_model_file

    zero = tmp_path / "zero.py"
    os.mknod(zero, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero's numbers: a read never ends
    with pytest.raises(PhazeError, match=r"zero\.py: is not a regular file, expected a MODEL\.py file$"):
        load_model_file(zero)


def test_fp8_params_on_a_step_without_fp8_linears_is_one_line_not_a_traceback(tmp_path, capsys):
    """Once known only when the step was priced (the sweep's pricing raised PlacementError, a
    ValueError, past phazec's handler); now refused before the work (session 63)."""
    from phaze.tools import phazec

    model = str(MODELS / "tiny_llama_sdpa.py")
    args = [model, "--hw", "h100", "--devices", "8", "--global-batch", "16", "--no-cache", "-q"]
    rc = phazec.main([*args, "--fp8-params", "-o", str(tmp_path / "p.mlir")])  # every point: the sweep
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if not line.startswith("phazec: warning:")]
    assert rc == 1 and "Traceback" not in err, err
    said = "phazec: error: --fp8-params: FP8 primary weights are the FP8 linears' of --dtype fp8, not amp-bfloat16"
    assert lines == [said]
    assert not (tmp_path / "p.mlir").exists()


# --- config.json ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"rope_theta": 0}, "rope_theta = 0: expected a positive number"),
        ({"rope_theta": -1.0}, "rope_theta = -1.0: expected a positive number"),
        ({"rope_theta": "10000"}, 'rope_theta = "10000": expected a positive number'),
        ({"rms_norm_eps": -1e-05}, "rms_norm_eps = -1e-05: expected a positive number"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "rope_scaling: factor = 0: expected a number >= 1"),
        ({"rope_scaling": {"rope_type": "linear", "factor": -2}}, "rope_scaling: factor = -2: expected a number >= 1"),
        ({"rope_scaling": {"rope_type": "linear", "factor": "2"}}, 'rope_scaling: factor = "2": expected a number'),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 0}}, "rope_parameters: rope_theta = 0: expected"),
        ({"hidden_act": "silo"}, "hidden_act = \"silo\": transformers has no such activation (did you mean 'silu'?)"),
        ({"hidden_act": "\x1b[31m"}, 'hidden_act = "\\u001b[31m": transformers has no such activation'),
        ({"pad_token_id": 1000000}, "pad_token_id = 1000000: expected a token of the vocabulary (0 to 255) or null"),
        ({"pad_token_id": -1}, "pad_token_id = -1: expected a token of the vocabulary"),
        ({"text_config": {"rms_norm_eps": 0}}, "config.json: text_config: rms_norm_eps = 0: expected a positive"),
    ],
    ids=[
        "rope-theta-zero",
        "rope-theta-negative",
        "rope-theta-string",
        "eps-negative",
        "rope-factor-zero",
        "rope-factor-negative",
        "rope-factor-string",
        "rope-parameters-theta-zero",
        "activation-misspelt",
        "activation-escape-code",
        "pad-token-past-the-vocabulary",
        "pad-token-negative",
        "nested-eps-zero",
    ],
)
def test_a_config_value_transformers_cannot_build_from_is_refused_naming_the_key(tmp_path, change, says):
    from phaze_ir.frontend.loader import load_hf_config

    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **change}))
    with pytest.raises(PhazeError) as info:
        load_hf_config(tmp_path / "config.json")  # before any model is built
    said = str(info.value)
    assert said.startswith("config.json: ") and says in said and "\n" not in said and "\x1b" not in said, said


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"num_local_experts": 2, "num_experts_per_tok": 4}, "num_experts_per_tok = 4: expected 1 to the 2 experts"),
        ({"num_local_experts": 4, "num_experts_per_tok": 0}, "num_experts_per_tok = 0: expected a positive integer"),
        ({"sliding_window": -5}, "sliding_window = -5: expected a positive integer or null"),
    ],
    ids=["top-k-above-the-experts", "top-k-zero", "negative-window"],
)
def test_a_mixtral_config_that_contradicts_itself_is_refused(tmp_path, change, says):
    from phaze_ir.frontend.loader import load_hf_config

    raw = {**LLAMA, "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], **change}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(PhazeError, match=r"^config\.json: ") as info:
        load_hf_config(tmp_path / "config.json")
    assert says in str(info.value), info.value


def test_an_architecture_named_with_control_characters_is_escaped(tmp_path):
    from phaze_ir.frontend.loader import load_hf_config

    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "architectures": ["Evil\x1b[2J\nerror: forged"]}))
    with pytest.raises(PhazeError) as info:
        load_hf_config(tmp_path / "config.json")
    said = str(info.value)
    assert said.startswith("config.json: architectures names Evil\\x1b[2J\\nerror: forged, not a causal"), said


@pytest.mark.parametrize("example", ["qwen2-7b", "mistral-7b"])
def test_published_configs_pass_the_value_checks(example):
    from phaze_ir.frontend.loader import load_hf_config

    spec = load_hf_config(ROOT / "examples" / "hf" / example / "config.json")
    assert spec.seq_len and spec.seq_len > 0


def test_values_within_their_rules_are_taken(tmp_path):
    from phaze_ir.frontend.loader import load_hf_config

    good = {**LLAMA, "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "pad_token_id": 255, "hidden_act": "silu",
            "rope_scaling": {"rope_type": "linear", "factor": 1}, "sliding_window": None}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(good))
    assert load_hf_config(tmp_path / "config.json").seq_len == 128


# --- plans that contradict themselves ------------------------------------------------------


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> str:
    """test_hostile_plan_relations' plan: DP 2 x PP 2 x CP 2 on 8 H100s (power limit 700 W)."""
    from test_hostile_plan_relations import _plan_text

    return _plan_text(str(tmp_path_factory.mktemp("plan")))


@pytest.mark.parametrize(
    ("old", "new", "relation"),
    [
        ('feasible = yes, binding = ""', 'feasible = no, binding = ""', "feasible = no with binding = ''"),
        ('feasible = yes, binding = ""', 'feasible = yes, binding = "memory"', "feasible = yes with binding = 'memory"),
        ("chip_power_w = ", "chip_power_w = 9", "chip_power_w = 9"),
        ("in_flight = ", "in_flight = 0, x = ", "stage 0 in_flight = 0: expected >= 1"),
        ('rank_order = "tp-dp-pp"', 'rank_order = "\x1b[31m"', "rank_order = '\\x1b[31m' with dp = 2: expected one"),
        ('pipeline_transfer = "whole"', 'pipeline_transfer = "halves"', "pipeline_transfer = 'halves' with dp = 2"),
    ],
    ids=[
        "unfit-without-a-binding",
        "fit-with-a-binding",
        "chip-above-its-power-limit",
        "nothing-in-flight",
        "rank-order-not-a-word",
        "pipeline-transfer-not-a-word",
    ],  # fmt: skip
)
def test_a_plan_that_contradicts_itself_is_refused(tmp_path, capsys, plan, old, new, relation):
    from test_hostile_plan_relations import edit, one_line_error, opt

    text = edit(plan, old, new)
    if new.startswith("in_flight = 0"):  # the stage's own in_flight replaced, not a field added
        text = re.sub(r"in_flight = 0, x = \d+", "in_flight = 0", text, count=1)
    if new.startswith("chip_power_w = 9"):  # above 700 W, and the mean still at most the busiest
        text = re.sub(r"chip_power_w = 9[0-9.e+-]+", "chip_power_w = 900.0", text, count=1)
    rc, out, err = opt(tmp_path, text, capsys=capsys)
    line = one_line_error(rc, err)
    assert "phaze.plan contradicts itself: " in line and relation in line and "\x1b" not in line, line
    assert out == ""


def test_a_chip_that_states_no_power_limit_is_not_held_to_one(tmp_path, capsys, plan):
    """power_limit_w = 0: the chip's file gives no limit (phaze-estimate-power writes 0.0)."""
    from test_hostile_plan_relations import edit, opt

    rc, _, err = opt(tmp_path, edit(plan, "power_limit_w = 700.0", "power_limit_w = 0.0"), capsys=capsys)
    assert rc == 0, err


# --- messages ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--devices", "9" * 400], "--devices 999999999999… (400 digits): expected a positive integer up to 2.15 G"),
        (["--global-batch=-" + "9" * 40], "--global-batch -999999999999… (40 digits): expected a positive integer"),
    ],
    ids=["400-digit-devices", "40-digit-negative-batch"],
)
def test_a_very_long_number_is_shown_by_its_first_digits_and_its_length(capsys, argv, says):
    from phaze.tools import phazec

    rc = phazec.main([str(MODELS / "tiny_llama_sdpa.py"), "--hw", "h100", *argv])
    line = one_line(capsys.readouterr().err)
    assert rc == 1 and line.startswith(f"phazec: error: {says}"), line
    assert len(line) < 160, line


def test_a_very_long_number_given_to_the_api_or_a_pass_is_shown_the_same_way(tmp_path, capsys):
    from phaze.api import options
    from phaze.tools import phaze_opt

    with pytest.raises(PhazeError, match=r"^phaze\.compile: devices=100000000000… \(501 digits\): expected a posi"):
        options("h100", devices=10**500)
    src = tmp_path / "in.mlir"
    src.write_text("builtin.module {}\n")
    assert phaze_opt.main([str(src), "-p", "phaze-place-devices{devices=" + "9" * 60 + "}"]) == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith("phaze-opt: error: phaze-place-devices: devices=999999999999… (60 digits): expected"), line


def test_a_misspelt_flag_with_a_control_character_is_escaped_in_the_did_you_mean(capsys):
    from phaze.tools import phazec

    with pytest.raises(SystemExit) as info:
        phazec.main([str(MODELS / "tiny_llama_sdpa.py"), "--h\x1bw", "h100"])
    line = one_line(capsys.readouterr().err)
    assert info.value.code == 2 and "\x1b" not in line, line
    assert "; --h\\x1bw: did you mean --hw?" in line, line
