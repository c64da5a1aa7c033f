"""Price the published multi-GPU training runs of ``data/published/multi_gpu_runs.csv`` with
``phazec`` as they ran, and print measured against priced.

    python benchmarks/price_published.py [--csv data/published/multi_gpu_runs.csv] [-j N]
        [--only ID,ID] [--json OUT.json] [--cache DIR]

Every row is one ``phazec MODEL.py --hw HW --devices N --placement expert:PP,DP,TP --tp TP
--micro-batch b --global-batch B --seq-len s --zero Z --recompute R --dtype D --kernels K ...
--json F`` (:func:`phazec_flags` maps a row to its flags; ``data/published/README.md`` says what
each column is and where each number comes from):

* the FSDP runs (IBM's fms-fsdp and torchtitan, Llama models with SDPA on A100 80 GB): ZeRO-3
  over every GPU with the gradients' and parameters' collectives overlapped (``--zero 3
  --dp-overlap``), FSDP's bf16 mixed precision (``param_dtype`` bf16: every op runs in bf16, the
  sharded fp32 state is the optimizer's) as ``--dtype bfloat16``, PyTorch eager's kernels with
  flash attention (``--kernels eager``; the model file's attention switched to SDPA with
  transformers' ``set_attn_implementation``, as :func:`model_file` writes it); IBM's rows run
  fms's own LLaMA (``fms:VARIANT``: ``examples/fms_llama.py``, its RoPE in fp32 and its loss
  on the bf16 logits, as fms-fsdp trained it);
* the Megatron-LM runs (Korthikanti et al. 2022 on Selene): the GPT that ``phaze-validate``
  builds for them (:func:`phaze.validate.write_model_file`), TP 8 and PP as run, sequence
  parallelism, selective or full recompute and the interleaved schedule as run, pipeline
  transfers split over the TP group, Megatron's fused kernels (``--kernels megatron``);
* the NeMo runs (NVIDIA's NeMo 24.07 performance summary, Llama 2 and 3 on DGX-H100): Megatron-core
  with Transformer Engine's FP8 linears (``--dtype fp8``), context parallelism over ``cp``
  devices (``--context-parallel``), TP, PP and the interleaved schedule as run, sequence
  parallelism with TE's userbuffers overlap where it ran (``--tp-overlap on``), the distributed
  Adam's sharded state with its collectives overlapped (``--zero 1 --dp-overlap``), Megatron's
  fused kernels and flash attention (``--kernels megatron``, the model file's attention SDPA).

The measured figure is a step time (``s/iteration``), a throughput (``tokens/s/gpu``, turned into
the step time ``global batch x sequence / (tokens/s/gpu x GPUs)``) or Megatron-LM's model
TFLOP/s per GPU (``megatron-tflops/s/gpu``: the step's FLOPs by :func:`megatron_model_flops` over
TFLOP/s x GPUs); the error is priced / measured
- 1 of the step time (a positive error: phaze is slow).  A row whose plan does not fit in the
chip's HBM is *refused* (phazec exits 1 naming the memory).  Rows marked ``exact`` in the
``as_run`` column are run as phaze can express them; the others say what differs (HSDP priced as
FSDP over every GPU), and the summary is printed for all rows and for the exact ones.
torchtitan's selective layer and op checkpointing are priced as they ran
(``--selective-recompute layer:2`` and ``op``).

phazec runs once per row, in its own process (``-j`` at a time), with a shared ``--cache``: the
same model at the same micro-batch and TP is traced and its layers scheduled once.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

DEFAULT_CSV = ROOT / "data" / "published" / "multi_gpu_runs.csv"
EXAMPLES = ROOT / "examples"
GIB = 2**30

#: The columns every row must fill (``published_mfu``, ``peak_memory_gib`` may be empty).
REQUIRED = (
    "id",
    "group",
    "model",
    "hw",
    "gpus",
    "sharding",
    "zero",
    "tp",
    "pp",
    "dp",
    "cp",
    "global_batch",
    "micro_batch",
    "seq_len",
    "precision",
    "recompute",
    "sequence_parallel",
    "tp_overlap",
    "dp_overlap",
    "pipeline_schedule",
    "attention",
    "compile",
    "kernels",
    "measured",
    "measured_unit",
    "as_run",
    "source",
    "where",
    "date",
)
#: phazec's --dtype of each published precision.
DTYPES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "amp-bf16": "amp-bfloat16",
    "amp-fp16": "amp-float16",
    "fp8": "fp8",  # Transformer Engine's FP8 linears (hybrid E4M3/E5M2, delayed scaling), bf16 elsewhere
    "fp8-tensorwise": "fp8",  # torchao's Float8Linear, dynamic per-tensor scales (torchtitan's float8 converter)
    "fp8-rowwise": "fp8",  # torchao's Float8Linear, dynamic per-row scales (float8.recipe_name "rowwise")
}
#: phazec's --fp8-recipe of the precisions that name their scaling (plain ``fp8`` leaves phazec's
#: own choice for the run's kernels: Transformer Engine's delayed scaling under Megatron-LM's).
FP8_RECIPES = {"fp8-tensorwise": "tensorwise", "fp8-rowwise": "rowwise"}
#: phazec's --recompute of each activation checkpointing as run, and what its selective policy
#: re-runs (--selective-recompute): Megatron-LM's attention core; torchtitan's every second block
#: checkpointed whole (``selective_ac_option = "2"`` at the runs' commit) or its per-op policy.
#: ``selective-share:P`` (:func:`recompute_flags`): fms-fsdp's share P of the blocks.
RECOMPUTE = {
    "none": ("none", "attention"),
    "full": ("full", "attention"),
    "selective": ("selective", "attention"),
    "selective-layer": ("selective", "layer:2"),
    "selective-op": ("selective", "op"),
}
SHARE = "selective-share:"


def recompute_flags(value: str) -> tuple[str, str]:
    """phazec's ``--recompute`` and ``--selective-recompute`` of a ``recompute`` column: a name
    of :data:`RECOMPUTE`, or ``selective-share:P``, fms-fsdp's ``selective_checkpointing = P``
    (``--selective-recompute share:P``); ValueError naming what is expected otherwise."""
    from passes.algorithms.recompute import parse_selective

    if value in RECOMPUTE:
        return RECOMPUTE[value]
    if value.startswith(SHARE):
        try:
            parse_selective(flag := "share:" + value.removeprefix(SHARE))
            return "selective", flag
        except ValueError as e:
            raise ValueError(f"recompute {value!r}: {e}") from None
    raise ValueError(f"recompute {value!r}, expected one of {', '.join(RECOMPUTE)} or {SHARE}P")


UNITS = ("tokens/s/gpu", "s/iteration", "megatron-tflops/s/gpu")
#: phazec's --optimizer of each published optimizer column.
OPTIMIZERS = ("adam", "adam-bf16", "adam-foreach")
#: phazec's --reduce-dtype of each published reduce_dtype column.
REDUCE_DTYPES = ("fp32", "bf16", "fp16")
#: phazec's --fsdp-version of each published fsdp column: the FSDP a ZeRO-3 run ran under.
FSDP_VERSIONS = ("2", "1")
#: A yes/no column's values.
YES_NO = ("yes", "no")
#: The columns a file written before CP and TP overlap were priced may lack, and what they mean then.
DEFAULTS = {
    "cp": "1",
    "tp_overlap": "off",
    "ep": "1",
    "moe": "no",
    "optimizer": "adam",
    "fp8_params": "no",
    "reduce_dtype": "fp32",
    "capacity_factor": "",
    "fsdp": "2",
}
#: Where --write-bands writes the error bands by regime that phaze's summary states (phaze/plan/error_bands.py).
BANDS = ROOT / "data" / "published" / "error_bands.json"


@dataclass(frozen=True)
class Row:
    """One published run."""

    id: str
    group: str  #: fsdp, megatron or nemo
    model: str  #: an examples/ model file's stem, gpt:hH-aA-lL-vV (Megatron's GPT) or fms:VARIANT (fms's LLaMA)
    hw: str
    gpus: int
    sharding: str
    zero: int
    tp: int
    pp: int
    dp: int
    cp: int  #: context parallelism: each sequence split over cp devices
    global_batch: int
    micro_batch: int
    seq_len: int
    precision: str
    recompute: str
    sequence_parallel: str
    tp_overlap: str  #: on: the sequence-parallel collectives overlapped with their GEMMs (TE userbuffers)
    dp_overlap: str  #: on: the data-parallel collectives overlapped with the backward (and forward)
    pipeline_schedule: str
    attention: str
    compile: str
    kernels: str
    measured: float
    measured_unit: str
    as_run: str
    source: str
    where: str
    date: str
    published_mfu: float | None = None
    peak_memory_gib: float | None = None
    ep: int = 1  #: expert parallelism (--expert-parallel)
    moe: str = "no"  #: yes: a mixture-of-experts model
    #: phazec's --optimizer: adam (fp32 master and moments, one fused kernel), adam-bf16 (Apex's
    #: distributed Adam with its state in bf16, NeMo's ``optim.dtype: bf16``) or adam-foreach
    #: (torch's default AdamW, eight foreach kernels: fms-fsdp's)
    optimizer: str = "adam"
    fp8_params: str = "no"  #: yes: FP8 primary weights (NeMo's fp8_params; phazec --fp8-params)
    #: phazec's --reduce-dtype: the dtype the run's DP gradient reduce(-scatter) moves
    reduce_dtype: str = "fp32"
    #: phazec's --capacity-factor: the MoE experts' inputs padded to this capacity (Megatron's
    #: ``moe_expert_capacity_factor`` with ``moe_pad_expert_input_to_capacity``); None: dropless
    capacity_factor: float | None = None
    #: phazec's --fsdp-version: 1 for torch's FullyShardedDataParallel (fms-fsdp), 2 for its
    #: fully_shard (torchtitan; the default, and what a run without FSDP leaves it)
    fsdp: str = "2"

    @property
    def exact(self) -> bool:
        return self.as_run == "exact"

    @property
    def measured_step_s(self) -> float:
        """The measured time of one training step (a global batch)."""
        if self.measured_unit == "s/iteration":
            return self.measured
        if self.measured_unit == "megatron-tflops/s/gpu":
            return megatron_model_flops(self) / (self.measured * 1e12 * self.gpus)
        return self.global_batch * self.seq_len / (self.measured * self.gpus)

    def tokens_per_s_per_gpu(self, step_s: float) -> float:
        return self.global_batch * self.seq_len / (step_s * self.gpus)


def megatron_model_flops(r: Row) -> float:
    """The model FLOPs of one step of ``r`` as Megatron-LM counts them for its "TFLOP/s/GPU"
    (``num_floating_point_operations``, ``megatron/training/training.py``, the form of
    megatron-core 0.6 to 0.9 that NeMo 24.03 to 24.07 ran): ``12 B s L h^2 ((1 + g/a + s/h) +
    (f/h) (3/2 gated) + V / (2 L h))``, the attention's whole s x s square counted (no causal
    half), the vocabulary unpadded.  Checked against NeMo 24.07's Llama 2 7B row: 780 model
    TFLOP/s per GPU at 16,934 tokens/s per GPU is 46.06e9 FLOPs a token, the formula's 46.08e9."""
    c = example_config(r.model)
    h, layers, heads = c.hidden_size, c.num_hidden_layers, c.num_attention_heads
    groups = getattr(c, "num_key_value_heads", None) or heads
    gated = 1.5 if getattr(c, "hidden_act", "gelu") in ("silu", "swiglu") else 1.0
    terms = (1 + groups / heads + r.seq_len / h) + (c.intermediate_size / h) * gated + c.vocab_size / (2 * layers * h)
    return 12.0 * r.global_batch * r.seq_len * layers * h * h * terms


def example_config(model: str):
    """The transformers configuration ``examples/<model>.py`` builds (its ``config()``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_published_{model}", EXAMPLES / f"{model}.py")
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"no model file examples/{model}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.config()


def _int(d: dict[str, str], k: str, where: str) -> int:
    try:
        return int(d[k])
    except ValueError as e:
        raise ValueError(f"{where}: {k} is {d[k]!r}, expected an integer") from e


def _float_or_none(text: str) -> float | None:
    return float(text) if text.strip() else None


def parse_row(d: dict[str, str], where: str) -> Row:
    """A CSV row as a :class:`Row`; ValueError says what is wrong with it."""
    d = dict(d)
    for k, v in DEFAULTS.items():
        if not (d.get(k) or "").strip():
            d[k] = v
    missing = [k for k in REQUIRED if not (d.get(k) or "").strip()]
    if missing:
        raise ValueError(f"{where}: empty {', '.join(missing)}")
    ints = {
        k: _int(d, k, where)
        for k in ("gpus", "zero", "tp", "pp", "dp", "cp", "ep", "global_batch", "micro_batch", "seq_len")
    }
    r = Row(
        id=d["id"].strip(),
        group=d["group"].strip(),
        model=d["model"].strip(),
        hw=d["hw"].strip(),
        sharding=d["sharding"].strip(),
        precision=d["precision"].strip(),
        recompute=d["recompute"].strip(),
        sequence_parallel=d["sequence_parallel"].strip(),
        tp_overlap=d["tp_overlap"].strip(),
        dp_overlap=d["dp_overlap"].strip(),
        pipeline_schedule=d["pipeline_schedule"].strip(),
        attention=d["attention"].strip(),
        compile=d["compile"].strip(),
        kernels=d["kernels"].strip(),
        measured=float(d["measured"]),
        measured_unit=d["measured_unit"].strip(),
        as_run=d["as_run"].strip(),
        source=d["source"].strip(),
        where=d["where"].strip(),
        date=d["date"].strip(),
        published_mfu=_float_or_none(d.get("published_mfu") or ""),
        peak_memory_gib=_float_or_none(d.get("peak_memory_gib") or ""),
        moe=d["moe"].strip(),
        optimizer=d["optimizer"].strip(),
        fp8_params=d["fp8_params"].strip(),
        reduce_dtype=d["reduce_dtype"].strip(),
        capacity_factor=_float_or_none(d["capacity_factor"]),
        fsdp=d["fsdp"].strip(),
        **ints,
    )
    if r.gpus != r.tp * r.pp * r.dp * r.cp:
        raise ValueError(f"{where}: {r.gpus} GPUs but TP x PP x DP x CP = {r.tp * r.pp * r.dp * r.cp}")
    if r.global_batch % (r.micro_batch * r.dp):
        raise ValueError(f"{where}: global batch {r.global_batch} is not a multiple of micro-batch x DP")
    try:
        recompute_flags(r.recompute)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    for column, choices in (
        ("precision", DTYPES),
        ("measured_unit", UNITS),
        ("moe", YES_NO),
        ("optimizer", OPTIMIZERS),
        ("reduce_dtype", REDUCE_DTYPES),
        ("fp8_params", YES_NO),
        ("fsdp", FSDP_VERSIONS),
    ):
        if (value := getattr(r, column)) not in choices:
            expected = "yes or no" if choices == YES_NO else f"one of {', '.join(choices)}"
            raise ValueError(f"{where}: {column} {value!r}, expected {expected}")
    from passes.algorithms.kernels import SDPA_ORDERS

    if (order := sdpa_order(r.attention)) is not None and order not in SDPA_ORDERS:
        orders = ", ".join(SDPA_ORDERS)
        raise ValueError(f"{where}: attention {r.attention!r}, expected sdpa:ORDER with ORDER one of {orders}")
    if r.capacity_factor is not None and r.moe != "yes":
        raise ValueError(f"{where}: capacity_factor {r.capacity_factor} needs moe yes (it pads the experts' inputs)")
    if r.fp8_params == "yes" and r.precision != "fp8":  # TE's FP8 weights, not torchao's
        raise ValueError(f"{where}: fp8_params yes needs precision fp8 (it keeps the FP8 linears' weights in FP8)")
    for k in ("sequence_parallel", "tp_overlap", "dp_overlap"):
        if getattr(r, k) not in ("on", "off"):
            raise ValueError(f"{where}: {k} {getattr(r, k)!r}, expected on or off")
    if r.sharding.startswith("hsdp:"):
        n = r.sharding.split(":", 1)[1]
        if not n.isdigit() or int(n) < 1 or (r.dp * r.cp) % int(n) or r.zero not in (2, 3):
            raise ValueError(
                f"{where}: sharding {r.sharding!r}, expected hsdp:N with N dividing DP x CP under ZeRO 2 or 3"
            )
    if r.tp_overlap == "on" and r.sequence_parallel != "on":
        raise ValueError(f"{where}: tp_overlap on needs sequence_parallel on (it overlaps SP's collectives)")
    return r


def read_rows(path: str | os.PathLike[str] = DEFAULT_CSV) -> list[Row]:
    with open(path, newline="", encoding="utf-8") as f:
        return [parse_row(d, f"{path}:{i + 2}") for i, d in enumerate(csv.DictReader(f))]


def gpt_shape(model: str):
    """The :class:`phaze.validate.Shape` of ``gpt:hH-aA-lL-vV`` at sequence ``s`` (see :func:`model_file`)."""
    from phaze.validate import Shape

    parts = dict((p[0], int(p[1:])) for p in model.split(":", 1)[1].split("-"))
    return Shape(hidden=parts["h"], heads=parts["a"], layers=parts["l"], seq_len=0, vocabulary=parts["v"])


def sdpa_order(attention: str) -> str | None:
    """phazec's --sdpa-order of an ``attention`` column ``sdpa:ORDER`` (torch's SDPA backend order
    the run's torch had: ``sdpa:flash-first``, FlashAttention-2 where today's torch runs cuDNN's);
    None for the others (phazec's default order)."""
    return attention.split(":", 1)[1] if attention.startswith("sdpa:") else None


def attention_implementation(attention: str) -> str:
    """transformers' attention implementation of an ``attention`` column (``sdpa:ORDER``: ``sdpa``)."""
    return attention.split(":", 1)[0]


def phazec_flags(r: Row, dp_overlap: bool = True) -> list[str]:
    """phazec's flags that price ``r`` as it ran (the model file and output flags apart);
    ``dp_overlap=False`` leaves the data-parallel collectives exposed (a bound, not how the runs
    ran).  With context parallelism the fixed placement is PP,DP,TP and ``--context-parallel``
    the CP degree (devices = PP x DP x TP x CP)."""
    flags = [
        "--hw",
        r.hw,
        "--devices",
        str(r.gpus),
        "--placement",
        f"expert:{r.pp},{r.dp},{r.tp}",
        "--tp",
        str(r.tp),
        "--micro-batch",
        str(r.micro_batch),
        "--global-batch",
        str(r.global_batch),
        "--seq-len",
        str(r.seq_len),
        "--zero",
        str(r.zero),
        "--recompute",
        recompute_flags(r.recompute)[0],
        "--selective-recompute",
        recompute_flags(r.recompute)[1],
        "--dtype",
        DTYPES[r.precision],
        "--kernels",
        r.kernels,
        "--sequence-parallel",
        r.sequence_parallel,
        "--context-parallel",
        str(r.cp),
        "--tp-overlap",
        r.tp_overlap,
        "--pipeline-schedule",
        r.pipeline_schedule,
        "--expert-parallel",
        str(r.ep),
        "--rank-order",
        "tp-dp-pp",
        "--memory-headroom",
        "0",  # a run that ran is priced as it ran: the headroom is for plans not yet run
        "--optimizer",
        r.optimizer,
        "--reduce-dtype",
        r.reduce_dtype,
        "--fsdp-version",
        r.fsdp,
    ]
    if r.precision in FP8_RECIPES:
        flags += ["--fp8-recipe", FP8_RECIPES[r.precision]]
    if r.sharding.startswith("hsdp:"):
        # HSDP: sharded over groups of N ranks (a node's GPUs), replicated over the rest
        flags += ["--dp-shard", r.sharding.split(":", 1)[1]]
    if r.fp8_params == "yes":
        flags.append("--fp8-params")
    if (order := sdpa_order(r.attention)) is not None:
        flags += ["--sdpa-order", order]
    if r.capacity_factor is not None:
        flags += ["--capacity-factor", f"{r.capacity_factor:g}"]
    if r.dp_overlap == "on" and dp_overlap:
        # FSDP prefetches the all-gathers and overlaps the reduce-scatters; NeMo's distributed
        # Adam overlaps its gradient reduce-scatters and parameter all-gathers
        flags.append("--dp-overlap")
    elif not dp_overlap:
        # the bound asked for: phazec's default overlaps on a GPU under eager or inductor kernels
        flags.append("--no-dp-overlap")
    if r.group == "megatron":
        flags += ["--pipeline-transfer", "split"]  # as phaze-validate prices these runs
    return flags


_WRAPPER = '''"""{stem} with transformers' {attention!r} attention (written by benchmarks/price_published.py)."""

import importlib.util

_spec = importlib.util.spec_from_file_location("_published_base", {path!r})
_base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_base)

NAME = _base.NAME + "-{attention}"
SEQ_LEN = _base.SEQ_LEN
get_inputs = _base.get_inputs


def get_model():
    model = _base.get_model()
    model.set_attn_implementation({attention!r})
    return model
'''


_FMS_WRAPPER = '''"""fms's LLaMA {variant} as fms-fsdp trained it (written by benchmarks/price_published.py)."""

import importlib.util
import sys

_spec = importlib.util.spec_from_file_location("fms_llama", {path!r})
_base = importlib.util.module_from_spec(_spec)
sys.modules["fms_llama"] = _base  # one of the model's sources: phaze's cache keys on its text
_spec.loader.exec_module(_base)

NAME = "fms-llama2-{variant}"
SEQ_LEN = _base.SEQ_LEN
get_inputs = _base.get_inputs


def get_model():
    return _base.get_model({variant!r})
'''

#: fms's LLaMA, the model of IBM's fms-fsdp rows (``fms:VARIANT``).
FMS_LLAMA = EXAMPLES / "fms_llama.py"


def fms_variant(model: str) -> str:
    """The variant of an ``fms:VARIANT`` model (one of ``examples/fms_llama.py``'s ``VARIANTS``)."""
    import importlib.util

    variant = model.removeprefix("fms:")
    spec = importlib.util.spec_from_file_location("_published_fms_llama", FMS_LLAMA)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"no model file {FMS_LLAMA}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if variant not in module.VARIANTS:
        raise ValueError(f"model {model}: expected fms:VARIANT, VARIANT one of {', '.join(module.VARIANTS)}")
    return variant


def model_file(r: Row, directory: str | os.PathLike[str]) -> str:
    """The model file that ``r`` is priced on: Megatron's GPT (``gpt:...``, as phaze-validate
    writes it), fms's LLaMA (``fms:VARIANT``: ``examples/fms_llama.py``, whose attention is
    SDPA's as fms ran it), or ``examples/<model>.py``, with its attention switched to the run's
    (``sdpa``: flash attention, as NeMo's and PyTorch's runs ran; Megatron's GPT keeps its own
    with ``megatron``)."""
    from phaze.validate import Shape, write_model_file

    if r.model.startswith("fms:"):
        if attention_implementation(r.attention) != "sdpa":
            raise ValueError(f"{r.id}: fms's LLaMA runs SDPA attention, not {r.attention}")
        variant = fms_variant(r.model)
        path = Path(directory) / f"fms_llama_{variant}.py"
        path.write_text(_FMS_WRAPPER.format(variant=variant, path=str(FMS_LLAMA)), encoding="utf-8")
        return str(path)
    if r.model.startswith("gpt:"):
        s = gpt_shape(r.model)
        base = Path(write_model_file(Shape(s.hidden, s.heads, s.layers, r.seq_len, s.vocabulary), directory))
        if r.attention in ("eager", "megatron"):  # Megatron's GPT as phaze-validate prices it
            return str(base)
    else:
        base = EXAMPLES / f"{r.model}.py"
        if not base.is_file():
            raise FileNotFoundError(f"{r.id}: no model file {base}")
        # (the examples build SDPA attention: a run's, eager too, is set by the wrapper)
    attention = attention_implementation(r.attention)
    path = Path(directory) / f"{base.stem}_{attention}.py"
    path.write_text(_WRAPPER.format(stem=r.model, attention=attention, path=str(base)), encoding="utf-8")
    return str(path)


@dataclass
class Priced:
    row: Row
    command: list[str]
    seconds: float = 0.0  #: phazec's wall time
    step_s: float | None = None  #: the plan's time per batch (None: refused or failed)
    memory_bytes: int = 0
    hbm_bytes: int = 0
    feasible: bool = False
    message: str = ""  #: phazec's last stderr line when it refused or failed
    breakdown: dict[str, float] = field(default_factory=dict)
    memory_parts: dict[str, int] = field(default_factory=dict)  #: the largest stage's memory by part
    warnings: list[str] = field(default_factory=list)

    @property
    def error(self) -> float | None:
        return None if self.step_s is None else self.step_s / self.row.measured_step_s - 1


@functools.cache
def _writes_infeasible() -> bool:
    """Whether this phazec takes --write-infeasible (then a refused plan's JSON, with its memory by
    part, is written too)."""
    proc = subprocess.run(
        [sys.executable, "-m", "phaze.tools.phazec", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    return "--write-infeasible" in proc.stdout


def price(r: Row, directory: str, cache: str | None, dp_overlap: bool = True) -> Priced:
    """Run phazec on ``r``; what it priced."""
    own = os.path.join(directory, r.id)  # a folder per row: rows priced at once write no file twice
    os.makedirs(own, exist_ok=True)
    out = os.path.join(own, "plan.json")
    cmd = [sys.executable, "-m", "phaze.tools.phazec", model_file(r, own), *phazec_flags(r, dp_overlap)]
    cmd += ["--json", out, "-o", os.devnull, "-q"]
    cmd += ["--cache", cache] if cache else ["--no-cache"]
    cmd += ["--write-infeasible"] if _writes_infeasible() else []
    p = Priced(r, cmd)
    if os.path.exists(out):
        os.remove(out)  # a plan of an earlier run (--keep) is not this one's
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    p.seconds = time.perf_counter() - start
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    p.message = lines[-1] if lines else f"exit status {proc.returncode}"
    if not os.path.exists(out):
        # refused without a plan written: the bytes the plan needs and the HBM, from the message
        m = re.search(r"needs at least (\d+) bytes per device.*HBM is (\d+) bytes", p.message)
        if m:
            p.memory_bytes, p.hbm_bytes = int(m.group(1)), int(m.group(2))
        return p
    with open(out, encoding="utf-8") as f:
        plan = json.load(f)
    p.feasible = bool(plan.get("feasible"))
    p.memory_bytes = int(plan.get("max_memory_bytes") or 0)
    p.hbm_bytes = int(plan.get("accelerator", {}).get("hbm_bytes") or 0)
    p.warnings = [str(w) for w in plan.get("warnings") or []]
    stages = plan.get("stages") or []
    if stages:
        top = max(stages, key=lambda s: s.get("memory_bytes", 0))
        p.memory_parts = {k: int(v) for k, v in (top.get("memory") or {}).items()}
    if p.feasible:
        p.step_s = float(plan["time_per_batch_s"])
        p.breakdown = {k: float(v) for k, v in (plan.get("breakdown_s") or {}).items()}
        p.message = ""
    return p


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def summary(priced: list[Priced]) -> dict[str, float | int | None]:
    errs = [p.error for p in priced if p.error is not None]
    worst = max(errs, key=abs) if errs else None
    return {
        "rows": len(priced),
        "priced": len(errs),
        "refused": sum(1 for p in priced if p.step_s is None),
        "median_abs_error": statistics.median(abs(e) for e in errs) if errs else None,
        "worst_error": worst,
        "mean_error": statistics.fmean(errs) if errs else None,
    }


def report(priced: list[Priced]) -> str:
    lines = [
        "step time: measured (from the published figure) and priced (the plan's time per batch); "
        "error = priced / measured - 1",
        f"{'id':<20}{'GPUs':>5} {'PP,DP,TP,CP':<12}{'b':>3}{'rec':>5} {'kern':<9}{'measured':>9}{'priced':>9}"
        f"{'error':>9}{'tok/s/GPU':>10}{'priced':>8}{'GiB':>7}{'HBM':>5}  as run",
    ]
    for p in priced:
        r = p.row
        lead = (
            f"{r.id:<20}{r.gpus:>5} {f'{r.pp},{r.dp},{r.tp},{r.cp}':<12}{r.micro_batch:>3}"
            f"{recompute_flags(r.recompute)[0][:4]:>5} {r.kernels:<9}{r.measured_step_s:9.3f}"
        )
        tps = r.global_batch * r.seq_len / (r.measured_step_s * r.gpus)
        mem = f"{p.memory_bytes / GIB:7.1f}{p.hbm_bytes / GIB:5.0f}" if p.memory_bytes else f"{'-':>7}{'-':>5}"
        note = "" if r.exact else f"  ({r.as_run})"
        if p.step_s is None:
            lines.append(f"{lead}{'refused' if p.memory_bytes else 'failed':>9}{'':>9}{tps:10.0f}{'':>8}{mem}{note}")
            lines.append(f"{'':<20}  {p.message}")
            continue
        lines.append(
            f"{lead}{p.step_s:9.3f}{_pct(p.error):>9}{tps:10.0f}{r.tokens_per_s_per_gpu(p.step_s):8.0f}{mem}"
            f"  {'exact' if r.exact else ''}{note}"
        )
    lines += ["", "priced step by part (breakdown_s, seconds):"]
    for p in priced:
        if p.breakdown:
            parts = "  ".join(f"{k.removesuffix('_s')} {v:.3f}" for k, v in p.breakdown.items() if v > 0)
            lines.append(f"  {p.row.id:<20}{parts}")
    lines += ["", "priced memory of the largest stage by part (GiB; HBM: the chip's):"]
    for p in priced:
        if p.memory_parts:
            parts = "  ".join(f"{k} {v / GIB:.1f}" for k, v in p.memory_parts.items())
            lines.append(f"  {p.row.id:<20}{parts}  = {p.memory_bytes / GIB:.1f} of {p.hbm_bytes / GIB:.0f}")
    lines += ["", "summary (|error| of the step time; refused: the plan needs more than the chip's HBM):"]
    for group in dict.fromkeys(p.row.group for p in priced):
        for label, sel in (("all rows", lambda p: True), ("exact rows", lambda p: p.row.exact)):
            s = summary([p for p in priced if p.row.group == group and sel(p)])
            if not s["rows"]:
                continue
            med = "-" if s["median_abs_error"] is None else f"{100 * s['median_abs_error']:.1f} %"
            lines.append(
                f"  {group:<9}{label:<11} rows {s['rows']:>2}  priced {s['priced']:>2}  refused {s['refused']}  "
                f"median |error| {med}  worst {_pct(s['worst_error'])}  mean {_pct(s['mean_error'])}"
            )
    warned = {w for p in priced for w in p.warnings}
    if warned:
        lines += ["", "phazec's warnings:"] + [f"  {w}" for w in sorted(warned)]
    return "\n".join(lines)


@functools.cache
def chip_name(hw: str) -> str:
    """The name of the chip that preset or file ``hw`` describes (what a plan's JSON calls it)."""
    from phaze.pipeline import load_accelerator

    return str(load_accelerator(str(ROOT / hw) if "/" in hw else hw).name)


def row_regime(r: Row):
    """The regime of a run (:class:`phaze.plan.error_bands.Regime`): its chip (as its plan names it),
    FSDP (ZeRO-3) or Megatron-style, FP8 or 16-bit, its sequence, CP, compiled kernels, MoE."""
    from phaze.plan.error_bands import regime

    fp8 = DTYPES[r.precision] == "fp8"
    return regime(chip_name(r.hw), r.zero, fp8, r.seq_len, r.cp, r.kernels, r.moe == "yes")


def row_state(p: Priced) -> str:
    """priced, refused (the plan does not fit the chip's HBM) or failed."""
    return "priced" if p.step_s is not None else ("refused" if p.memory_bytes else "failed")


def p90(values: list[float]) -> float:
    """The nearest-rank 90th percentile: the smallest of ``values`` that at least 90 % of them
    are at most."""
    ordered = sorted(values)
    return ordered[max(0, -(-9 * len(ordered) // 10) - 1)]


def error_stats(errors: list[float]) -> dict[str, float | None]:
    """median and p90 |error| and mean signed error of ``errors`` (None without any)."""
    if not errors:
        return {"median_abs_error": None, "p90_abs_error": None, "mean_error": None}
    return {
        "median_abs_error": round(statistics.median(abs(e) for e in errors), 4),
        "p90_abs_error": round(p90([abs(e) for e in errors]), 4),
        "mean_error": round(statistics.fmean(errors), 4),
    }


def band_table(rows: list[Row], results: dict[str, tuple[str, float | None]]) -> dict:
    """The error bands by regime of ``rows`` priced as ``results`` (id: state and error), as
    ``data/published/error_bands.json`` holds them: each run's regime, state and error (rounded
    to 1e-4, the figures the statistics are computed from) and each regime's count, p90 and
    median |error| and mean signed error over its priced runs."""
    runs = {}
    for r in rows:
        st, err = results[r.id]
        runs[r.id] = {"regime": row_regime(r).key, "state": st, "error": None if err is None else round(err, 4)}
    regimes: dict[str, dict] = {}
    for r in sorted(rows, key=lambda r: row_regime(r)):
        g = row_regime(r)
        entry = regimes.setdefault(g.key, {"words": g.words(), "runs": 0, "priced": 0, "refused": 0, "ids": []})
        entry["runs"] += 1
        entry["ids"].append(r.id)
        entry["priced" if runs[r.id]["state"] == "priced" else "refused"] += 1
    for entry in regimes.values():
        errs = [runs[i]["error"] for i in entry["ids"] if runs[i]["error"] is not None]
        entry.update(error_stats(errs))
    return {
        "about": "phaze's step-time error (priced / measured - 1) on the published runs of "
        "data/published/multi_gpu_runs.csv, by regime (phaze/plan/error_bands.py); refused counts the runs "
        "not priced (refused for memory or failed); p90 is the nearest-rank 90th percentile of |error|",
        "command": "python benchmarks/price_published.py -j 2 --write-bands",
        "regimes": regimes,
        "runs": runs,
    }


#: The dimensions of a regime, how the per-regime report names each value.
DIMENSIONS = (
    ("hardware", lambda g: g.chip.upper()),
    ("framework style", lambda g: "FSDP" if g.style == "fsdp" else "Megatron"),
    ("precision", lambda g: "FP8" if g.precision == "fp8" else "bf16/fp16"),
    ("sequence", lambda g: ">=16k" if g.long_sequence else "<16k"),
    ("context parallelism", lambda g: "CP" if g.cp else "no CP"),
    ("torch.compile", lambda g: "compiled" if g.compile else "not compiled"),
    ("MoE", lambda g: "MoE" if g.moe else "dense"),
)


def regime_report(rows: list[Row], results: dict[str, tuple[str, float | None]]) -> str:
    """The errors by regime, one dimension at a time (docs/validation.md): for each value, the
    rows, how many were priced, median |error|, p90 |error| and mean signed error; then each
    whole regime (as the bands hold them) and the runs not priced."""
    out = [f"{'dimension':<21}{'value':<14}{'rows':>5}{'priced':>7}{'median |e|':>11}{'p90 |e|':>9}{'mean e':>9}"]

    def fmt(label: str, value: str, sel: list[Row]) -> str:
        errs = [e for e in (results[r.id][1] for r in sel) if e is not None]
        s = error_stats(errs)
        cells = []
        for k in ("median_abs_error", "p90_abs_error", "mean_error"):
            v = s[k]
            cells.append("-" if v is None else (f"{100 * v:+.1f} %" if k == "mean_error" else f"{100 * v:.1f} %"))
        return f"{label:<21}{value:<14}{len(sel):>5}{len(errs):>7}{cells[0]:>11}{cells[1]:>9}{cells[2]:>9}"

    out.append(fmt("all", "", rows))
    for name, value_of in DIMENSIONS:
        values: dict[str, list[Row]] = {}
        for r in rows:
            values.setdefault(value_of(row_regime(r)), []).append(r)
        for value, sel in sorted(values.items()):
            out.append(fmt(name, value, sel))
    bands = band_table(rows, results)
    out += ["", "by whole regime (the bands phaze's summary states):"]
    for key, e in bands["regimes"].items():
        p = "-" if e["p90_abs_error"] is None else f"±{100 * e['p90_abs_error']:.1f} %"
        m = "-" if e["mean_error"] is None else f"{100 * e['mean_error']:+.1f} %"
        out.append(f"  {key:<44} runs {e['runs']:>2}  priced {e['priced']:>2}  p90 {p:>9}  mean {m:>8}")
    missed = [f"  {r.id}: {results[r.id][0]}" for r in rows if results[r.id][1] is None]
    if missed:
        out += ["", "not priced:", *missed]
    return "\n".join(out)


def results_of_json(path: str) -> dict[str, tuple[str, float | None]]:
    """The state and error of each row of an earlier ``--json`` output (or of a bands file)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data.get("runs"), dict):  # a bands file
        return {i: (v["state"], v["error"]) for i, v in data["runs"].items()}
    out = {}
    for d in data["rows"]:
        st = "priced" if d["priced_step_s"] is not None else ("refused" if d["memory_bytes"] else "failed")
        out[d["id"]] = (st, d["error"])
    return out


def write_bands(path: str | os.PathLike[str], bands: dict, results: dict[str, tuple[str, float | None]]) -> int:
    """Write the band table, all or nothing (a temporary file renamed over ``path``); refused
    (1, a line on stderr, the old file kept) when a row failed: a band of a crashed run's rows
    would tell every plan of its regime that nothing was priced."""
    failed = sorted(i for i, (state, _) in results.items() if state == "failed")
    if failed:
        print(
            f"--write-bands: {len(failed)} rows failed ({', '.join(failed[:5])}...): {path} left as it was",
            file=sys.stderr,
        )
        return 1
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(bands, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(DEFAULT_CSV))
    ap.add_argument("--only", default="", help="comma-separated row ids (default: every row)")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="phazec processes at a time (default 1)")
    ap.add_argument("--cache", default=None, help="phazec --cache DIR (default: phazec's own cache)")
    ap.add_argument("--no-cache", action="store_true", help="phazec --no-cache")
    ap.add_argument("--json", default=None, help="also write the rows and summaries as JSON")
    ap.add_argument("--show-commands", action="store_true", help="print each phazec command line")
    ap.add_argument(
        "--no-dp-overlap",
        action="store_true",
        help="price the data-parallel collectives exposed, not overlapped with compute (a bound, not as run)",
    )
    ap.add_argument("--keep", default=None, metavar="DIR", help="keep each row's model file and plan JSON in DIR/<id>/")
    ap.add_argument(
        "--write-bands",
        nargs="?",
        const=str(BANDS),
        default=None,
        metavar="FILE",
        help=f"write the error bands by regime that phaze's summary states (default {BANDS.relative_to(ROOT)}); "
        "needs every row of the CSV",
    )
    ap.add_argument(
        "--from-json",
        action="append",
        default=[],
        metavar="FILE",
        help="do not price: take each row's state and error from an earlier --json output or a bands file "
        "(several: a later file's rows replace an earlier's)",
    )
    ap.add_argument("--regimes", action="store_true", help="print the errors by regime (docs/validation.md)")
    args = ap.parse_args(argv)

    rows = read_rows(args.csv)
    if args.only:
        wanted = set(args.only.split(","))
        rows = [r for r in rows if r.id in wanted]
    if args.write_bands and args.only:
        ap.error("--write-bands needs every row: drop --only")
    if args.from_json:
        results: dict[str, tuple[str, float | None]] = {}
        for path in args.from_json:
            results |= results_of_json(path)
        missing = [r.id for r in rows if r.id not in results]
        if missing:
            ap.error(f"--from-json: no result for {', '.join(missing)}")
        if args.regimes:
            print(regime_report(rows, results))
        if args.write_bands:
            return write_bands(args.write_bands, band_table(rows, results), results)
        return 0
    cache = None if args.no_cache else (args.cache or os.path.join(os.path.expanduser("~"), ".cache", "phaze"))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="phaze-published-") as tmp:
        where = args.keep or tmp
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            priced = list(pool.map(lambda r: price(r, where, cache, not args.no_dp_overlap), rows))
    for p in priced:
        state = "refused" if p.step_s is None and p.memory_bytes else ("failed" if p.step_s is None else "priced")
        print(f"{p.row.id}: {state} in {p.seconds:.0f} s", file=sys.stderr)
        if args.show_commands:
            print("  " + " ".join(p.command[1:]), file=sys.stderr)
    print(report(priced))
    print(f"\n({len(priced)} rows in {time.perf_counter() - start:.0f} s)")
    if args.json:
        out = {
            "rows": [
                {
                    "id": p.row.id,
                    "group": p.row.group,
                    "exact": p.row.exact,
                    "measured_step_s": p.row.measured_step_s,
                    "priced_step_s": p.step_s,
                    "error": p.error,
                    "memory_bytes": p.memory_bytes,
                    "hbm_bytes": p.hbm_bytes,
                    "feasible": p.feasible,
                    "message": p.message,
                    "breakdown_s": p.breakdown,
                    "memory_parts_bytes": p.memory_parts,
                    "command": " ".join(p.command[1:]),
                }
                for p in priced
            ],
            "summary": {
                g: summary([p for p in priced if p.row.group == g]) for g in dict.fromkeys(r.group for r in rows)
            },
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    results = {p.row.id: (row_state(p), p.error) for p in priced}
    if args.regimes:
        print("\n" + regime_report(rows, results))
    if args.write_bands:
        return write_bands(args.write_bands, band_table(rows, results), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
