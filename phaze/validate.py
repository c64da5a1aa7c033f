"""Validation of the cost model against measured training runs (``phaze-validate``).

A CSV of measured runs (one GPT training configuration and its measured time per iteration a
row; the columns are those of the vTrain authors' measurements, :data:`COLUMNS`) is priced run
by run: each GPT is built from its shape on the meta device (:func:`model_file_text`, a model
file like ``examples/gpt2_xl.py``), traced, compiled through the IR pipeline on the given
hardware (``phazec --hw``'s passes) and placed at exactly the run's placement
(``phaze-place-devices{placement="expert:PP,DP,TP"}``, the run's devices and global batch);
the predicted time per batch is compared with the measured one.

Work is shared as far as the runs allow, so that 1,440 runs take minutes:

* identical runs (equal but for their row, measured time and split) are read and checked once
  and priced once (:func:`pricing_key`): 100,000 rows of one run take seconds, not hours;
* one trace per (shape, micro-batch) (a trace has concrete shapes, so not fewer): every TP
  width and every run of that shape and micro-batch uses it; a model of at least 12 alike
  blocks is traced cut to 5 and 6 of them (checked alike), not whole (the trace deepened
  where the model is compiled whole);
* the pipeline up to ``recompute`` once per (shape, micro-batch, TP, sequence parallelism,
  kernels) (the kernels, ``phazec --kernels``: the file's ``kernels`` column, else the
  validation's; runs priced as two runtimes share their trace): for a model of at least
  :data:`COMPILED_FROM_CUT` blocks from the cut, as ``phazec`` compiles one point (the 5- and
  6-block steps to ``latency``, the first deepened to all the blocks: a few blocks' passes, not
  all of them), else from a copy of the whole step after the TP-independent passes (``phazec
  --emit training``), which run once per trace;
* the local workers fork from one server that imported torch, transformers' GPT-2 and the
  passes once (:data:`WORKER_MODULES`), not each for itself;
* only ``phaze-place-devices`` runs per distinct run (it reads nothing of what it writes, so it is
  applied in turn to the one module, not to copies);
* the shapes that differ only in their number of layers go to the same worker, whose schedule
  cache (``passes.algorithms.schedule.ScheduleCache``) then solves their identical blocks once;
  independent groups run in parallel on a :func:`phaze.search.backend.make_backend` backend.

A row with a value beyond its physical plausibility bound (:data:`COLUMN_BOUNDS`,
:data:`MAX_STEP_BYTES`) is refused alone (:attr:`Run.refused`), before anything is traced: it is
reported among the runs not priced, the others are priced.

The held-apart part (:func:`assign_splits`): a fixed fraction of the runs (default a fifth),
chosen by a seeded hash of each run's values, never depends on the order of the rows.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from passes.algorithms.kernels import RUNTIMES
from passes.algorithms.option_values import Dtype, PipelineSchedule, RankOrder, Recompute, Runtime
from phaze_ir.errors import PhazeError
from phaze_ir.files import RefusedFile, excerpt, read_regular

if TYPE_CHECKING:
    from phaze.options import Options

Log = Callable[[str], None]

#: What the local workers import before pricing (``phaze.search.backend.start_fork_server``:
#: once, in the server they fork from; a module that is not installed is left out).
WORKER_MODULES = (
    "torch",
    "transformers.models.gpt2.modeling_gpt2",
    "passes",
    "phaze.pipeline",
    "phaze.deepen_compiled",
)

#: Fewest repeated blocks of a model whose compilations are made from its cut
#: (:func:`compiled_modules`): compiling the 5- and 6-block steps and checking the first
#: deepened against the second costs about what compiling 30-40 blocks whole does (vTrain's
#: GPTs, ``-j 1`` on the 2-core machine at load 2-3, seconds per compilation whole / from the
#: cut: 16 blocks 0.7 / 1.4, 30 blocks 1.2 / 1.5, 40 blocks 2.1 / 2.2, 48 blocks 2.4 / 2.2,
#: 96 blocks 5.1 / 3.1).
COMPILED_FROM_CUT = 32

#: The largest CSV file read: 100,000 runs are about 6 MB.
CSV_LIMIT = 64 << 20

#: The columns a run needs: field name -> header (as the vTrain files spell them; matched
#: without case and surrounding blanks, a UTF-8 byte-order mark stripped).
COLUMNS = {
    "gpus": "# GPUs",
    "global_batch": "global batch",
    "micro_batch": "micro batch",
    "hidden": "hidden size",
    "heads": "attention heads",
    "layers": "# layers",
    "seq_len": "sequence length",
    "tp": "tensor parallelism",
    "dp": "data parallelism",
    "pp": "pipeline parallelism",
    "measured_ms": "iteration time (ms)",
}
#: Optional columns: the tokenizer's vocabulary (padded as Megatron pads it, see
#: :data:`VOCAB_MULTIPLE`), the training precision, a given split (``dev`` or ``holdout``), and
#: how the run was run where it differs from the vTrain runs: its recompute (``none``,
#: ``selective``, ``full``; default ``--recompute``), sequence parallelism (``on``/``off``,
#: default ``off``), pipeline schedule (``1f1b``, default, or ``interleaved:V``) and rank order
#: (how the devices were numbered into groups: ``tp-dp-pp``, the default, pipeline outermost as
#: Megatron-LM, torchtitan and Megatron-DeepSpeed's topology (the vTrain runs) number them, or
#: ``tp-pp-dp``, Megatron-LM's ``--use-tp-pp-dp-mapping``) and pipeline transfer (``split``, the
#: default: each TP rank sends 1/t of a stage boundary's values and the next stage's TP group
#: all-gathers them, as Megatron-DeepSpeed's pipeline engine (the vTrain runs) and Megatron-LM
#: before sequence parallelism (its scatter-gather) ran them; ``whole``: every rank sends all),
#: and the runtime whose kernels it ran (``kernels``: ``ops``, ``eager``, ``inductor``,
#: ``megatron``, as ``phazec --kernels``; default the validation's ``--kernels``).
OPTIONAL_COLUMNS = {
    "vocabulary": "vocabulary",
    "dtype": "dtype",
    "split": "split",
    "recompute": "recompute",
    "sequence_parallel": "sequence parallelism",
    "pipeline_schedule": "pipeline schedule",
    "rank_order": "rank order",
    "pipeline_transfer": "pipeline transfer",
    "kernels": "kernels",
}
#: Columns read and not used: they describe a run that the other columns already determine
#: (the vTrain files' model size).  Any other column is refused, with the closest known name:
#: a column phaze-validate does not read (a ``context parallelism``) would be dropped and its
#: runs priced as runs without it.
IGNORED_COLUMNS = ("Parameters (billion)",)
#: How close a header must be to a known one to be suggested (difflib's ratio): 'iteration
#: time (s)' (0.97), 'global batch size' (0.83), '# gpus' for 'gpus' (0.8); not 'tensor
#: parallelism' for 'context parallelism' (0.76), a different thing.
SUGGEST_CUTOFF = 0.8
#: How a run's devices were numbered when the file does not say (see OPTIONAL_COLUMNS).
DEFAULT_RANK_ORDER = "tp-dp-pp"
#: How a run's pipeline transfers crossed a stage boundary when the file does not say.
DEFAULT_PIPELINE_TRANSFER = "split"
#: Megatron's GPT-2 BPE vocabulary, the default of Megatron's GPT (and of the vTrain runs).
DEFAULT_VOCABULARY = 50257
#: Megatron pads the vocabulary to a multiple of ``make-vocab-size-divisible-by`` (128) x TP.
#: The model is built with the vocabulary padded to 128; ``phaze-shard-tensor-parallel`` pads
#: it further to a multiple of 128 x TP (its ``vocab_multiple``), so every TP width gets
#: Megatron's padded size (50,304 at TP 1, 50,432 at TP 2, 50,688 at TP 4, 51,200 at TP 8).
VOCAB_MULTIPLE = 128
DTYPES = ("float16", "bfloat16", "float32")
SPLITS = ("dev", "holdout")
DEFAULT_HOLDOUT = 0.2
DEFAULT_SEED = 0
#: The recompute of the runs priced (the vTrain runs checkpoint every layer's activations).
DEFAULT_RECOMPUTE = "full"
#: The runtimes whose kernels a run can be priced as (``phazec --kernels``, a 'kernels' column).
KERNELS = RUNTIMES

# The physical plausibility bounds of a row.  A value beyond one is no run that ever was or could
# be (each bound is ten or more times the largest run known), and past them the model cannot be
# built or priced (tensor sizes overflow torch's and the IR's 64-bit integers, the IR grows with
# the layers): such a row is refused before anything is traced, the others are priced.
#: GPUs of a run, and so its TP, DP and PP (each divides them): 2^20, ten times the largest GPU
#: clusters built (about 100,000 GPUs in 2024).
MAX_GPUS = 2**20
#: Sequences of a global batch (and of a micro-batch): 2^24, 256 times the largest published
#: (65,536 sequences: LAMB's BERT, You et al. 2019).
MAX_BATCH = 2**24
#: Hidden size: 2^20, 40 times the widest GPT trained (25,600: Megatron-LM's 1T-parameter GPT);
#: the attention heads likewise (a head has at least one channel).
MAX_HIDDEN = 2**20
#: Layers: 2^12, four times the deepest Transformer trained (1,000: DeepNet, Wang et al. 2022).
MAX_LAYERS = 2**12
#: Sequence length: 2^24 tokens, above the longest contexts trained (about 10 million).
MAX_SEQ_LEN = 2**24
#: Vocabulary: 2^22, 16 times the largest tokenizers (256,000: Gemma's).
MAX_VOCABULARY = 2**22
#: The measured time of one training iteration, in ms: at least 1e-3 ms (1 µs: a step is a
#: forward, a backward and an update, and one GPU kernel launch alone takes about 3-5 µs), at
#: most 1e9 ms (11.6 days: the longest steps known, of the largest models on few GPUs, are
#: minutes).  Beyond them a time is a unit or a typing error (1e308 ms; 1e-300 ms), and its
#: run's error would be a 300-digit percentage.
MIN_MEASURED_MS = 1e-3
MAX_MEASURED_MS = 1e9
#: The bound of each integer column (the vocabulary's is :data:`MAX_VOCABULARY`).
COLUMN_BOUNDS = {
    "gpus": MAX_GPUS,
    "global_batch": MAX_BATCH,
    "micro_batch": MAX_BATCH,
    "hidden": MAX_HIDDEN,
    "heads": MAX_HIDDEN,
    "layers": MAX_LAYERS,
    "seq_len": MAX_SEQ_LEN,
    "tp": MAX_GPUS,
    "dp": MAX_GPUS,
    "pp": MAX_GPUS,
}
#: The most memory a run's step may need (:func:`step_bytes`): the HBM of :data:`MAX_GPUS`
#: accelerators of 256 GB each (an H200 has 141 GB, the largest parts about 288 GB), 2.7e17 B.
#: A step that needs more fits on no cluster built or near it, and below it phaze's memory counts
#: (64-bit integers in the IR, up to 9.2e18 B; they come within a few times of the estimate)
#: keep a margin of 34 times.  Each column can be within its bound and the step still absurd:
#: 4,096 heads over a sequence of 2^24 tokens are 2^60 attention scores a layer.
MAX_STEP_BYTES = MAX_GPUS * 256 * 10**9


@dataclass(frozen=True)
class Shape:
    """A GPT as Megatron builds it: learned positions, GELU MLP of 4h, tied embeddings."""

    hidden: int
    heads: int
    layers: int
    seq_len: int
    vocabulary: int = DEFAULT_VOCABULARY
    dtype: str = "float16"

    @property
    def name(self) -> str:
        name = f"gpt-h{self.hidden}-a{self.heads}-l{self.layers}-s{self.seq_len}"
        if self.vocabulary != DEFAULT_VOCABULARY:
            name += f"-v{self.vocabulary}"
        return name + ("" if self.dtype == Dtype.FLOAT16 else f"-{self.dtype}")

    @property
    def padded_vocabulary(self) -> int:
        """The vocabulary the model is built with (padded to :data:`VOCAB_MULTIPLE`)."""
        return -(-self.vocabulary // VOCAB_MULTIPLE) * VOCAB_MULTIPLE

    @property
    def family(self) -> tuple:
        """What the shape shares with the shapes that only have more or fewer layers (their
        blocks are the same layer: the same schedules)."""
        return (self.hidden, self.heads, self.seq_len, self.vocabulary, self.dtype)


@dataclass(frozen=True)
class Run:
    """One measured run (a data row of the CSV)."""

    row: int  #: 1 for the first data row
    line: int  #: its line in the file (the header is line 1)
    gpus: int
    global_batch: int
    micro_batch: int
    hidden: int
    heads: int
    layers: int
    seq_len: int
    tp: int
    dp: int
    pp: int
    measured_ms: float
    vocabulary: int = DEFAULT_VOCABULARY
    dtype: str = "float16"
    split: str = ""  #: "dev" or "holdout" (given in the file, or by :func:`assign_splits`)
    recompute: str = ""  #: the run's recompute policy ('': the validation's ``--recompute``)
    sequence_parallel: bool = False
    pipeline_schedule: PipelineSchedule = PipelineSchedule("1f1b", 1)
    rank_order: str = DEFAULT_RANK_ORDER
    pipeline_transfer: str = DEFAULT_PIPELINE_TRANSFER
    #: the runtime whose kernels price the run ('': the validation's ``--kernels``)
    kernels: str = ""
    #: why the row is not priced ('': it is): a value beyond its plausibility bound
    #: (:data:`COLUMN_BOUNDS`, :data:`MAX_STEP_BYTES`), said as the row's column and bound
    refused: str = ""

    @property
    def shape(self) -> Shape:
        return Shape(self.hidden, self.heads, self.layers, self.seq_len, self.vocabulary, self.dtype)

    @property
    def placement(self) -> str:
        return f"expert:{self.pp},{self.dp},{self.tp}"

    @property
    def measured_s(self) -> float:
        return self.measured_ms / 1e3

    def where(self, name: str) -> str:
        """``runs.csv:3: row 2``: where the run is in file ``name``."""
        return f"{name}:{self.line}: row {self.row}"

    def identity(self) -> str:
        """The run's values, as the split hashes them (not its position in the file).  The
        kernels are not among them: they say how phaze prices the run, as ``--hw`` does, and a
        run priced as another runtime's kernels is held apart or not as before."""
        return ",".join(
            str(v)
            for v in (
                self.gpus,
                self.global_batch,
                self.micro_batch,
                self.hidden,
                self.heads,
                self.layers,
                self.seq_len,
                self.tp,
                self.dp,
                self.pp,
                repr(float(self.measured_ms)),
                self.vocabulary,
                self.dtype,
                # (the defaults add nothing: the vTrain runs' identities, and so the split, stay)
                *([self.recompute] if self.recompute else []),
                *(["sp"] if self.sequence_parallel else []),
                *([self.pipeline_schedule] if self.pipeline_schedule.virtual_stages != 1 else []),
                *([self.rank_order] if self.rank_order != DEFAULT_RANK_ORDER else []),
                *([self.pipeline_transfer] if self.pipeline_transfer != DEFAULT_PIPELINE_TRANSFER else []),
            )
        )


# ------------------------------------------------------------------------------------------
# Reading the CSV
# ------------------------------------------------------------------------------------------


def _norm(header: str) -> str:
    return " ".join(header.replace("\ufeff", "").strip().lower().split())


def read_runs(path: str | os.PathLike[str]) -> list[Run]:
    """The runs of a CSV file (see :data:`COLUMNS`), each checked; a missing column or an
    inconsistent row is a :class:`PhazeError` of one line naming it."""
    name = os.fspath(path)
    try:
        text = read_regular(path, CSV_LIMIT, "CSV file").decode("utf-8-sig")
    except FileNotFoundError:
        raise PhazeError(f"{name}: no such file") from None
    except RefusedFile as e:
        raise PhazeError(f"{name}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise PhazeError(f"{name}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise PhazeError(f"{name}: cannot read: {e.strerror or e}") from None
    return parse_runs(text, name)


def parse_runs(text: str, name: str = "<csv>") -> list[Run]:
    """The runs of CSV text (:func:`read_runs`)."""
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    try:
        header = next(reader)
    except StopIteration:
        raise PhazeError(f"{name}: empty file, expected a header line and one run per line") from None
    except csv.Error as e:
        raise PhazeError(f"{name}:1: not CSV: {e}") from None
    index = {_norm(h): i for i, h in enumerate(header)}
    for head in (*COLUMNS.values(), *OPTIONAL_COLUMNS.values()):
        at = [i + 1 for i, h in enumerate(header) if _norm(h) == _norm(head)]
        if len(at) > 1:
            raise PhazeError(f"{name}:1: column '{head}' is given {len(at)} times (columns {at}): expected once")
    columns: dict[str, int] = {}
    for fld, head in COLUMNS.items():
        if _norm(head) not in index:
            raise PhazeError(
                f"{name}: no column '{head}' (a run needs: " + ", ".join(f"'{h}'" for h in COLUMNS.values()) + ")"
            )
        columns[fld] = index[_norm(head)]
    for fld, head in OPTIONAL_COLUMNS.items():
        if _norm(head) in index:
            columns[fld] = index[_norm(head)]
    _refuse_unknown_columns(header, name)
    runs: list[Run] = []
    # Rows that differ only in their measured time are read and checked once (a file of 100,000
    # runs is mostly repeats): the others are the first one's copies with their own row, line
    # and time.
    described = [i for fld, i in columns.items() if fld != "measured_ms"]
    seen: dict[tuple[str | None, ...], Run] = {}
    try:
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            n, line = len(runs) + 1, reader.line_num
            if any(cell.strip() for cell in row[len(header) :]):  # a cell no column names
                raise PhazeError(
                    f"{name}:{line}: row {n} has {len(row)} cells, expected at most the header's {len(header)}"
                )
            key = tuple(row[i] if i < len(row) else None for i in described)
            first = seen.get(key)
            if first is None:
                seen[key] = first = _run(row, columns, n, line, name)
                run = first
            else:
                ms = _measured_ms(row, columns, f"{name}:{line}: row {n}")
                run = _with(first, row=n, line=line, measured_ms=ms)
            # each row's own time (the first's copies share its shape, not its time)
            implausible = _implausible_ms(run.measured_ms)
            runs.append(_with(run, refused=implausible) if implausible and not run.refused else run)
    except csv.Error as e:
        raise PhazeError(f"{name}:{reader.line_num}: not CSV: {e}") from None
    if not runs:
        raise PhazeError(f"{name}: no runs (a header line and no data rows)")
    if "split" in columns:
        unset = [r.row for r in runs if not r.split]
        if unset:
            raise PhazeError(f"{name}: row {unset[0]}: the split column is empty (give dev or holdout on every row)")
    return runs


def _with(run: Run, **changes: Any) -> Run:
    """``run`` with ``changes``: ``dataclasses.replace`` without its checks, five times faster
    (it is called once a row)."""
    return Run(**{**vars(run), **changes})


def _cell(row: list[str], columns: dict[str, int], fld: str, where: str) -> str:
    i = columns[fld]
    if i >= len(row) or not row[i].strip():
        head = COLUMNS.get(fld) or OPTIONAL_COLUMNS[fld]
        raise PhazeError(f"{where}: no value for '{head}'")
    return row[i].strip()


def _refuse_unknown_columns(header: list[str], name: str) -> None:
    """A column that is neither read (:data:`COLUMNS`, :data:`OPTIONAL_COLUMNS`) nor known to
    be left aside (:data:`IGNORED_COLUMNS`) is one line naming it and the closest known one."""
    import difflib

    known = {_norm(h): h for h in (*COLUMNS.values(), *OPTIONAL_COLUMNS.values())}
    aside = {_norm(h) for h in IGNORED_COLUMNS}
    for i, head in enumerate(header):
        norm = _norm(head)
        if not norm or norm in known or norm in aside:
            continue
        near = difflib.get_close_matches(norm, list(known), n=1, cutoff=SUGGEST_CUTOFF)
        hint = f" (did you mean '{known[near[0]]}'?)" if near else ""
        raise PhazeError(
            f"{name}:1: unknown column {i + 1} '{excerpt(head.strip())}'{hint}: its runs would be priced without it "
            "(docs/usage.md lists the columns phaze-validate reads)"
        )


def _implausible_ms(ms: float) -> str:
    """Why the measured time ``ms`` is no iteration's (its row is refused), or ''."""
    if MIN_MEASURED_MS <= ms <= MAX_MEASURED_MS:
        return ""
    return (
        f"'{COLUMNS['measured_ms']}' is {ms:.6g}, expected a time of one iteration from {MIN_MEASURED_MS:g} to "
        f"{MAX_MEASURED_MS:g} ms"
    )


#: A number as a CSV cell writes it: decimal digits, a point, an exponent. Python's ``float``
#: also reads ``1_000``, ``nan``, ``infinity`` and surrounding spaces, which no spreadsheet
#: writes for a number: such a cell is refused, not read as 1000.
_CSV_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def _csv_number(text: str) -> float:
    """The number a cell writes (:data:`_CSV_NUMBER`), NaN when it writes none."""
    return float(text) if _CSV_NUMBER.fullmatch(text.strip()) else math.nan


def _measured_ms(row: list[str], columns: dict[str, int], where: str) -> float:
    text = _cell(row, columns, "measured_ms", where)
    ms = _csv_number(text)
    if not (math.isfinite(ms) and ms > 0):
        raise PhazeError(
            f"{where}: '{COLUMNS['measured_ms']}' is {excerpt(repr(text))}, expected a positive number of "
            f"milliseconds (one iteration's: from {MIN_MEASURED_MS:g} to {MAX_MEASURED_MS:g} ms)"
        )
    return ms


def _positive_int(text: str, head: str, bound: int, where: str) -> tuple[int, str]:
    """The positive integer ``text`` of column ``head``, and why its row is refused when it is
    beyond ``bound`` ('' when not); a cell that is no positive integer is a PhazeError (the
    file is not what it says)."""
    expected = f"'{head}' is {text!r}, expected a positive integer up to {bound}"
    value = _csv_number(text)
    if not (math.isfinite(value) and value == int(value) and value >= 1):
        raise PhazeError(f"{where}: {expected}")
    return int(value), (expected if value > bound else "")


def _run(row: list[str], columns: dict[str, int], n: int, line: int, name: str) -> Run:
    where = f"{name}:{line}: row {n}"
    ints: dict[str, Any] = {}
    refusals: list[str] = []
    for fld, bound in COLUMN_BOUNDS.items():
        ints[fld], refused = _positive_int(_cell(row, columns, fld, where), COLUMNS[fld], bound, where)
        refusals.append(refused)
    ms = _measured_ms(row, columns, where)
    vocabulary, dtype, split = DEFAULT_VOCABULARY, "float16", ""
    if (value := _optional_cell(row, columns, "vocabulary")) is not None:
        vocabulary, refused = _positive_int(value, OPTIONAL_COLUMNS["vocabulary"], MAX_VOCABULARY, where)
        refusals.append(refused)
    if (value := _optional_cell(row, columns, "dtype")) is not None:
        dtype = value.lower()
        dtype = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}.get(dtype, dtype)
        if dtype not in DTYPES:
            raise PhazeError(f"{where}: 'dtype' is {dtype!r}, expected one of {', '.join(DTYPES)}")
    if (value := _optional_cell(row, columns, "split")) is not None:
        split = value.lower()
        if split not in SPLITS:
            raise PhazeError(f"{where}: 'split' is {split!r}, expected dev or holdout")
    recompute, sequence_parallel, schedule, order, transfer, kernels = _how_run(row, columns, where)
    run = Run(
        n,
        line,
        **ints,
        measured_ms=ms,
        vocabulary=vocabulary,
        dtype=dtype,
        split=split,
        recompute=recompute,
        sequence_parallel=sequence_parallel,
        pipeline_schedule=schedule,
        rank_order=order,
        pipeline_transfer=transfer,
        kernels=kernels,
    )
    _check_consistent(run, where)
    refused = next((r for r in refusals if r), "")
    if not refused and (need := step_bytes(run)) > MAX_STEP_BYTES:
        refused = (
            f"the step of hidden size {run.hidden}, {run.heads} attention heads, {run.layers} layers, sequence "
            f"length {run.seq_len} and micro batch {run.micro_batch} needs about {si_bytes(need)}, expected at most "
            f"{si_bytes(MAX_STEP_BYTES)} (the memory of {MAX_GPUS} GPUs of 256 GB)"
        )
    return _with(run, refused=refused) if refused else run


def step_bytes(r: Run) -> int:
    """About the memory of ``r``'s training step, unsharded, in bytes: the weights with their
    gradients and Adam's states (16 bytes a parameter: 16-bit weights and gradients, 32-bit
    master weights and two moments; ZeRO, Rajbhandari et al. 2020) and one micro-batch's
    activations without recompute (s·b·h·(34 + 5·a·s/h) bytes a layer at 16 bits: Korthikanti
    et al. 2022, eq. 1; the 32-bit logits and their loss, 6 bytes each).  Python's integers: the
    absurd rows it is for overflow no 64-bit count."""
    h, a, s, b, v = r.hidden, r.heads, r.seq_len, r.micro_batch, r.shape.padded_vocabulary
    parameters = 12 * r.layers * h * h + (v + s) * h
    activations = r.layers * s * b * (34 * h + 5 * a * s) + 6 * s * b * v
    return 16 * parameters + activations * (2 if r.dtype == Dtype.FLOAT32 else 1)


def si_bytes(n: int) -> str:
    """``2.68e17`` bytes as ``268 PB``: three significant digits, SI prefixes (decimal)."""
    from phaze.plan.summary import si

    return si(n, "B")


def _optional_cell(row: list[str], columns: dict[str, int], fld: str) -> str | None:
    """The stripped value of optional column ``fld`` in ``row``; None when the file has no such
    column or the cell is empty."""
    i = columns.get(fld)
    return row[i].strip() if i is not None and i < len(row) and row[i].strip() else None


def _how_run(row: list[str], columns: dict[str, int], where: str) -> tuple[str, bool, PipelineSchedule, str, str, str]:
    """The run's recompute ('' when not given), sequence parallelism, pipeline schedule, rank
    order, pipeline transfer and kernels ('' when not given)."""
    from passes.algorithms.placement import (
        PIPELINE_TRANSFERS,
        RANK_ORDER_SETTINGS,
        RECOMPUTE_SETTINGS,
        PlacementError,
        pipeline_schedule,
    )

    def given(fld: str) -> str | None:
        text = _optional_cell(row, columns, fld)
        return None if text is None else text.lower()

    recompute, sequence_parallel, schedule = "", False, Run.pipeline_schedule
    if (text := given("recompute")) is not None:
        if text not in RECOMPUTE_SETTINGS[1:]:
            raise PhazeError(f"{where}: 'recompute' is {text!r}, expected none, selective or full")
        recompute = text
    if (text := given("sequence_parallel")) is not None:
        if text not in ("on", "off"):
            raise PhazeError(f"{where}: 'sequence parallelism' is {text!r}, expected on or off")
        sequence_parallel = text == "on"
    if (text := given("pipeline_schedule")) is not None:
        try:
            schedule = pipeline_schedule(text)
            if schedule.virtual_stages is None:
                raise PlacementError("auto is not how a run was run")
        except PlacementError as e:
            raise PhazeError(f"{where}: 'pipeline schedule' is {text!r}: expected 1f1b or interleaved:V ({e})") from e
    order = DEFAULT_RANK_ORDER
    if (text := given("rank_order")) is not None:
        if text not in RANK_ORDER_SETTINGS[1:]:
            raise PhazeError(f"{where}: 'rank order' is {text!r}, expected {' or '.join(RANK_ORDER_SETTINGS[1:])}")
        order = text
    transfer = DEFAULT_PIPELINE_TRANSFER
    if (text := given("pipeline_transfer")) is not None:
        if text not in PIPELINE_TRANSFERS:
            raise PhazeError(f"{where}: 'pipeline transfer' is {text!r}, expected {' or '.join(PIPELINE_TRANSFERS)}")
        transfer = text
    kernels = ""
    if (text := given("kernels")) is not None:
        if text not in KERNELS:
            raise PhazeError(f"{where}: 'kernels' is {text!r}, expected {', '.join(KERNELS[:-1])} or {KERNELS[-1]}")
        kernels = text
    return recompute, sequence_parallel, schedule, order, transfer, kernels


def _check_consistent(r: Run, where: str) -> None:
    """What Megatron would refuse to run, or what contradicts itself."""
    if r.gpus != r.tp * r.dp * r.pp:
        raise PhazeError(f"{where}: {r.gpus} GPUs but TP x DP x PP = {r.tp} x {r.dp} x {r.pp} = {r.tp * r.dp * r.pp}")
    if r.global_batch % (r.micro_batch * r.dp):
        raise PhazeError(
            f"{where}: global batch {r.global_batch} is not a multiple of micro batch x DP = "
            f"{r.micro_batch} x {r.dp} = {r.micro_batch * r.dp}"
        )
    if r.hidden % r.heads:
        raise PhazeError(f"{where}: hidden size {r.hidden} is not a multiple of the {r.heads} attention heads")
    if r.heads % r.tp:
        raise PhazeError(f"{where}: {r.heads} attention heads cannot be split over TP {r.tp}")
    if r.pp > r.layers:
        raise PhazeError(f"{where}: {r.pp} pipeline stages for {r.layers} layers")


def assign_splits(runs: Sequence[Run], fraction: float = DEFAULT_HOLDOUT, seed: int = DEFAULT_SEED) -> list[Run]:
    """The runs with their split: the ``round(fraction * n)`` runs of smallest
    ``sha256("phaze-validate/<seed>/<values>")`` (ties, i.e. duplicate rows, by row) are
    ``holdout``, the others ``dev``.  It depends on the runs' values only, never on the order
    of the rows; runs whose split the file gives keep it (then nothing is drawn)."""
    if not 0 <= fraction <= 1:
        raise PhazeError(f"--holdout {fraction}: expected a fraction in [0, 1]")
    if runs and all(r.split for r in runs):
        return list(runs)

    digests: dict[str, str] = {}  # by identity: repeated runs are hashed once

    def key(r: Run) -> tuple[str, int]:
        identity = r.identity()
        if (digest := digests.get(identity)) is None:
            digests[identity] = digest = hashlib.sha256(f"phaze-validate/{seed}/{identity}".encode()).hexdigest()
        return digest, r.row

    held = {r.row for r in sorted(runs, key=key)[: round(fraction * len(runs))]}
    return [_with(r, split="holdout" if r.row in held else "dev") for r in runs]


# ------------------------------------------------------------------------------------------
# The models
# ------------------------------------------------------------------------------------------


def model_file_text(shape: Shape) -> str:
    """A phaze model file (docs/usage.md, "A model file") of the GPT of ``shape``, as Megatron-LM builds
    it: learned positions (``n_positions`` = the sequence), pre-LN blocks with a GELU MLP of 4h,
    dropout 0.1 (Megatron's hidden and attention dropout), the word embedding tied to the LM
    head, the vocabulary padded to :data:`VOCAB_MULTIPLE`.  ``phazec MODEL.py --hw ...
    --placement expert:PP,DP,TP`` on it prices a run as ``phaze-validate`` does."""
    return f'''"""{shape.name}: Megatron-LM's GPT (hidden {shape.hidden}, {shape.heads} heads, {shape.layers} layers,
sequence {shape.seq_len}, vocabulary {shape.vocabulary} padded to {shape.padded_vocabulary}), written by phaze-validate.
Built from its configuration on the meta device: no weights, no downloads."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

NAME = "{shape.name}"
SEQ_LEN = {shape.seq_len}


def config() -> GPT2Config:
    return GPT2Config(
        vocab_size={shape.padded_vocabulary},
        n_positions={shape.seq_len},
        n_embd={shape.hidden},
        n_layer={shape.layers},
        n_head={shape.heads},
        activation_function="gelu",
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
        attn_implementation="eager",
    )


def get_model() -> torch.nn.Module:
    return GPT2LMHeadModel(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {{"input_ids": ids, "labels": ids}}
'''


class ModelFileNotWritten(PhazeError):
    """The model file of a run could not be written (a full disk, ``ulimit -f``): the tool's own
    failure, which stops the run (one line, a non-zero exit), not a row's refusal."""


def write_model_file(shape: Shape, directory: str | os.PathLike[str]) -> str:
    """Write the model file of ``shape`` into ``directory`` (``<name>.py``); its path."""
    path = os.path.join(os.fspath(directory), shape.name.replace(".", "_") + ".py")
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(model_file_text(shape))
    except OSError as e:  # a full disk, a file-size limit (ulimit -f): one line, not a traceback
        raise ModelFileNotWritten(f"cannot write the model file of {shape.name} ({path}): {e.strerror or e}") from None
    return path


# ------------------------------------------------------------------------------------------
# Pricing
# ------------------------------------------------------------------------------------------


def pricing_options(hw: str, **given: Any) -> Options:
    """The driver options runs are priced with on ``hw``, where a run's file does not say
    otherwise: ``Options``' defaults (phazec --hw's: its solver limits, every op its own kernel)
    but full recompute (:data:`DEFAULT_RECOMPUTE`), and ``given``."""
    from phaze.options import Options

    return Options(**{"hw": hw, "recompute": DEFAULT_RECOMPUTE} | given)


@dataclass(frozen=True)
class Settings:
    """How runs are priced: ``options``, the driver's options every run starts from (the chip,
    the recompute and the kernels of runs whose file does not say, the solver's limits:
    :func:`pricing_options`, or phaze-validate's flags), each run's placement and columns
    replacing theirs (:meth:`options_of`); and where the layer schedules are kept."""

    options: Options
    cache_dir: str | None = None
    quiet: bool = False
    #: The loaded ``options.hw`` (:func:`validate` loads it once: every run is priced on the
    #: same chip, even if the file changes meanwhile).
    accelerator: Any = field(default=None, compare=False)

    def options_of(self, run: Run) -> Options:
        """The driver's options of ``run`` (for the placement pass): its placement, dtype and
        what its columns say."""
        return replace(
            self.options,
            dtype=Dtype(run.dtype),  # (the run record's, checked when it was read)
            devices=run.gpus,
            global_batch=run.global_batch,
            placement=run.placement,
            recompute=Recompute(run.recompute) if run.recompute else self.options.recompute,
            pipeline_schedule=run.pipeline_schedule,
            rank_order=RankOrder(run.rank_order),  # (checked when it was read)
            pipeline_transfer=run.pipeline_transfer,
            kernels=Runtime(self.kernels_of(run)),
        )

    def kernels_of(self, run: Run) -> str:
        """The runtime whose kernels price ``run``: the file's, else ``--kernels``."""
        return run.kernels or self.options.kernels


@dataclass
class Priced:
    """What phaze predicts for one run."""

    row: int
    predicted_s: float | None  #: None: not feasible, or not priced
    feasible: bool
    note: str = ""  #: the binding constraint, or why the run could not be priced
    memory_bytes: int = 0  #: the plan's largest memory per device
    recompute: str = ""  #: the stages' recompute policies


@dataclass
class Job:
    """The runs of one (shape, micro-batch): one trace."""

    shape: Shape
    micro_batch: int
    runs: tuple[Run, ...]

    @property
    def compilations(self) -> list[tuple[int, bool, str]]:
        """The (TP width, sequence parallelism, kernels) of its runs: one compilation each (the
        trace and the TP-independent passes do not depend on them; a run's kernels as it has
        them, '' for the validation's: :func:`validate` gives every run its own first)."""
        return sorted({(r.tp, r.sequence_parallel, r.kernels) for r in self.runs})

    def cost(self) -> float:
        """A guess of its work, for balancing: the IR is about proportional to the layers; a
        trace costs about what half a compilation does."""
        return self.shape.layers * (0.5 + len(self.compilations)) + 0.01 * len(self.runs)


@dataclass
class JobResult:
    priced: list[Priced]
    trace_s: float = 0.0
    compile_s: float = 0.0
    place_s: float = 0.0
    compiles: int = 0


def jobs_of(runs: Sequence[Run]) -> list[Job]:
    """One job per (shape, micro-batch), in order of first appearance."""
    groups: dict[tuple[Shape, int], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.shape, r.micro_batch), []).append(r)
    return [Job(s, b, tuple(rs)) for (s, b), rs in groups.items()]


def bundles_of(jobs: Sequence[Job], workers: int) -> list[list[Job]]:
    """The jobs as at most ``4 * workers`` bundles (one task each on the backend, which then does
    not chunk them), largest first: the jobs of one shape family (equal but for the layers) and
    micro-batch stay in one bundle, so that one worker's schedule cache solves their identical
    blocks once; families are spread over the bundles largest first (LPT)."""
    families: dict[tuple, list[Job]] = {}
    for j in jobs:
        families.setdefault((j.shape.family, j.micro_batch), []).append(j)
    fams = sorted(families.values(), key=lambda js: -sum(j.cost() for j in js))
    if workers <= 1:
        return [[j for fam in fams for j in sorted(fam, key=lambda j: j.shape.layers)]]
    n = min(len(fams), 4 * workers)
    bundles: list[list[Job]] = [[] for _ in range(n)]
    load = [0.0] * n
    for fam in fams:
        k = load.index(min(load))
        bundles[k] += sorted(fam, key=lambda j: j.shape.layers)
        load[k] += sum(j.cost() for j in fam)
    order = sorted(range(n), key=lambda k: -load[k])
    return [bundles[k] for k in order if bundles[k]]


_CACHES: dict[str | None, Any] = {}


def _cache(directory: str | None):
    """This process's schedule cache (one per directory; None: in memory)."""
    from passes.algorithms.schedule import ScheduleCache

    if directory not in _CACHES:
        _CACHES[directory] = ScheduleCache(directory)
    return _CACHES[directory]


def price_bundle(work: tuple[Settings, list[Job]]) -> list[JobResult]:
    """Price the jobs of a bundle, in this process (a backend's work item)."""
    settings, jobs = work
    return [price_job(job, settings) for job in jobs]


def _say(settings: Settings, msg: str) -> None:
    if not settings.quiet:
        from phaze.messages import log_line

        print(log_line("phaze-validate", msg), file=sys.stderr, flush=True)


def price_job(job: Job, settings: Settings) -> JobResult:
    """Trace the job's model once, compile it once per TP width, place each run."""
    from xdsl.passes import PassPipeline

    from phaze.plan.plan_output import plan_record
    from phaze_ir import keys
    from phaze_ir.attributes import StageInfoAttr

    out = JobResult([])
    for (tp, sp, kernels), runs, module, passes, ctx in compiled_modules(job, settings, out):
        if isinstance(module, PhazeError):
            out.priced += [Priced(r.row, None, False, f"not priced: {module}") for r in runs]
            continue
        start = time.perf_counter()
        for r in runs:
            # phaze-place-devices reads only the cost passes' annotations and overwrites what it
            # writes (phaze.plan, phaze.stages, phaze.stage): each run is placed on the one
            # module, as on a fresh copy of it.
            place = passes("plan", tp, settings.options_of(r))[-1]
            PassPipeline((place,)).apply(ctx, module)
            plan = plan_record(module)
            feasible = plan.get("feasible") == "yes"
            stages = [s.as_dict() for s in keys.records_of(module, keys.STAGES, StageInfoAttr)]
            out.priced.append(
                Priced(
                    r.row,
                    float(plan["time_per_batch_s"]) if feasible else None,
                    feasible,
                    "" if feasible else str(plan.get("binding", "")),
                    int(plan.get("max_memory_bytes", 0)),
                    ",".join(sorted({str(s["recompute"]) for s in stages})),
                )
            )
        placed = time.perf_counter() - start
        out.place_s += placed
        label = f"{job.shape.name} b={job.micro_batch}, {_width(tp, sp, kernels)}"
        _say(settings, f"{label}: {len(runs)} run(s) placed in {placed:.2f} s")
    return out


def _width(tp: int, sp: bool, kernels: str) -> str:
    """``TP 2 + SP, megatron kernels``: a compilation, for the progress messages."""
    return f"TP {tp}" + (" + SP" if sp else "") + ("" if kernels == "ops" else f", {kernels} kernels")


def compiled_modules(job: Job, settings: Settings, out: JobResult):
    """Trace the job's model once and compile it once per (TP width, sequence parallelism,
    kernels) through the cost passes (``phazec --emit recompute``), on ``settings``'
    accelerator: yields ``((tp, sp, kernels), the runs compiled so, module or the PhazeError
    that stopped its compilation, passes, context)`` per compilation (``kernels`` the runtime
    it was compiled for: a run's own, else ``settings.options.kernels``), ``passes(stage, tp,
    options)`` giving a stage's passes (for the placement); the trace and compile seconds go
    into ``out``.  Each module is handed out before the next is made: keep from it what you
    need.

    A model of at least :data:`COMPILED_FROM_CUT` alike blocks is traced cut to 5 of them
    (:func:`phaze_ir.frontend.deepen.trace_cut_or_whole`) and each compilation is compiled
    from the cut (:func:`phaze.deepen_compiled.compile_from_cut`: the 5- and 6-block steps to
    the latency stage, deepened, the rest on the whole module), as phazec compiles its one
    point: the passes up to latency then cost a few blocks' time, not all of them.  Where the
    compiled cut does not deepen to the whole step's bytes, or raises, that compilation is made
    from the whole step, as before."""
    import tempfile

    from xdsl.passes import PassPipeline

    from passes import ALL_PASSES
    from passes.solver_options import SolverOptions
    from phaze.pipeline import compile_from, copy_for, load_accelerator, pipeline, training_step
    from phaze_ir.frontend import load_model_file, trace_cut_or_whole
    from phaze_ir.frontend.deepen import deepen
    from phaze_ir.ir import make_context

    opts = replace(settings.options_of(job.runs[0]), schedule_cache=_cache(settings.cache_dir))
    accelerator = settings.accelerator if settings.accelerator is not None else load_accelerator(settings.options.hw)
    ctx = make_context()
    label = f"{job.shape.name} b={job.micro_batch}"

    def passes(stage: str, tp: int, o=opts, sequence_parallel: bool = False) -> tuple:
        parsed = PassPipeline.parse_spec(ALL_PASSES, pipeline(stage, tp, o, sequence_parallel)).passes
        return tuple(replace(p, cache=o.schedule_cache) if isinstance(p, SolverOptions) else p for p in parsed)

    compilations = job.compilations
    start = time.perf_counter()
    try:
        folder = tempfile.TemporaryDirectory(prefix="phaze-validate-")
    except OSError as e:  # no writable temporary folder (a full disk, ulimit -f: tempfile probes by writing)
        raise ModelFileNotWritten(f"cannot make a temporary folder for the model files: {e.strerror or e}") from None
    try:
        with folder as tmp:
            spec = load_model_file(write_model_file(job.shape, tmp))
            traced = trace_cut_or_whole(spec, job.micro_batch, job.shape.seq_len, training=True, dtype=job.shape.dtype)
        depth = traced.blocks[1] if traced.blocks is not None else 0  # 0: the whole step
        if 0 < depth < COMPILED_FROM_CUT:  # the whole step, as trace_step deepens it
            traced, depth = deepen(traced, depth), 0
        out.trace_s = time.perf_counter() - start
        # The TP-independent part of the pipeline (phazec --emit training) of a whole step, once
        # for every width (a cut step's compilations import the cut).
        start = time.perf_counter()
        base = None if depth else training_step(traced, opts, accelerator)
        out.compile_s += time.perf_counter() - start
    except ModelFileNotWritten:
        raise  # this machine's failure, not the row's: the run stops
    except PhazeError as e:
        # A model that cannot be built or traced leaves its runs unpriced, each with the reason,
        # as a compilation that fails does: the other runs are priced.
        _say(settings, f"{label}: not priced: {e}")
        for tp, sp, given in compilations:
            runs = [r for r in job.runs if (r.tp, r.sequence_parallel, r.kernels) == (tp, sp, given)]
            yield (tp, sp, given or settings.options.kernels), runs, e, passes, ctx
        return
    how = "traced cut to 5 and 6 blocks" if depth else "traced and imported"
    _say(settings, f"{label}: {how} in {out.trace_s + out.compile_s:.1f} s")

    for k, (tp, sp, given) in enumerate(compilations):
        runs = [r for r in job.runs if (r.tp, r.sequence_parallel, r.kernels) == (tp, sp, given)]
        kernels = given or settings.options.kernels
        o = replace(opts, kernels=Runtime(kernels))
        start = time.perf_counter()
        error = None
        try:
            module = _from_cut(traced, tp, o, accelerator, sp) if depth else None
            if module is None:  # the whole step's, its training part made once (the cut's at need)
                if base is None:
                    base = training_step(deepen(traced, depth), opts, accelerator)
                module = compile_from(copy_for(base, k, len(compilations)), "training", "recompute", tp, o, sp)
        except PhazeError as e:
            error = e
        compiled = time.perf_counter() - start
        out.compile_s += compiled
        out.compiles += 1
        width = _width(tp, sp, kernels)
        if error is not None:
            _say(settings, f"{label}, {width}: not priced: {error}")
            yield (tp, sp, kernels), runs, error, passes, ctx
            continue
        _say(settings, f"{label}, {width}: compiled in {compiled:.1f} s")
        yield (tp, sp, kernels), runs, module, passes, ctx
        del module


def _from_cut(cut, tp: int, opts: Options, accelerator, sequence_parallel: bool):
    """The whole step compiled to the recompute stage from ``cut``
    (:func:`phaze.deepen_compiled.compile_from_cut`), or None where that is not the whole
    step's module or raised: the whole step's compilation then says why, as it always did."""
    from phaze.deepen_compiled import compile_from_cut

    try:
        return compile_from_cut(cut, tp, opts, accelerator, sequence_parallel, stage="recompute")
    except PhazeError:
        return None


# ------------------------------------------------------------------------------------------
# The validation
# ------------------------------------------------------------------------------------------


@dataclass
class Validation:
    """Every run with its prediction, the summaries and the time spent."""

    runs: list[Run]
    priced: dict[int, Priced]
    settings: Settings
    source: str = ""
    holdout: float = DEFAULT_HOLDOUT
    seed: int = DEFAULT_SEED
    timing: dict[str, Any] = field(default_factory=dict)

    def error(self, r: Run) -> float | None:
        """predicted / measured - 1 (None when the run has no prediction)."""
        p = self.priced.get(r.row)
        if p is None or p.predicted_s is None:
            return None
        return p.predicted_s / r.measured_s - 1

    def summary(self, split: str, worst: int = 5) -> dict[str, Any]:
        """Count, median and p90 of |error|, mean signed error and the worst runs of ``split``
        (``dev``, ``holdout`` or ``all``)."""
        import numpy as np

        runs = [r for r in self.runs if split == "all" or r.split == split]
        errors = [(r, e) for r in runs if (e := self.error(r)) is not None]
        abs_e = np.array([abs(e) for _, e in errors])
        worst_runs = sorted(errors, key=lambda x: (-abs(x[1]), x[0].row))[:worst]
        return {
            "runs": len(runs),
            "priced": len(errors),
            "not_priced": len(runs) - len(errors),
            "median_abs_error": float(np.median(abs_e)) if errors else None,
            "p90_abs_error": float(np.percentile(abs_e, 90)) if errors else None,
            "mean_error": float(np.mean([e for _, e in errors])) if errors else None,
            "worst": [r.row for r, _ in worst_runs],
        }

    def run_record(self, r: Run) -> dict[str, Any]:
        p = self.priced.get(r.row)
        return {
            "row": r.row,
            "line": r.line,
            "split": r.split,
            "model": r.shape.name,
            "gpus": r.gpus,
            "global_batch": r.global_batch,
            "micro_batch": r.micro_batch,
            "hidden": r.hidden,
            "heads": r.heads,
            "layers": r.layers,
            "seq_len": r.seq_len,
            "vocabulary": r.vocabulary,
            "dtype": r.dtype,
            "tp": r.tp,
            "dp": r.dp,
            "pp": r.pp,
            "placement": r.placement,
            "measured_s": r.measured_s,
            "predicted_s": p.predicted_s if p else None,
            "error": self.error(r),
            "feasible": bool(p and p.feasible),
            "note": p.note if p else "not priced",
            "memory_bytes": p.memory_bytes if p else 0,
            "recompute": p.recompute if p else "",
            "sequence_parallel": r.sequence_parallel,
            "pipeline_schedule": r.pipeline_schedule,
            "rank_order": r.rank_order,
            "pipeline_transfer": r.pipeline_transfer,
            "kernels": self.settings.kernels_of(r),
        }

    def to_json(self, worst: int = 5) -> dict[str, Any]:
        """Everything, for machines (the schema is in docs/usage.md, "Validating the cost model")."""
        return {
            "csv": self.source,
            "hw": self.settings.options.hw,
            "recompute": self.settings.options.recompute,
            "kernels": self.settings.options.kernels,
            "holdout_fraction": self.holdout,
            "seed": self.seed,
            "runs": [self.run_record(r) for r in self.runs],
            "summary": {s: self.summary(s, worst) for s in ("dev", "holdout", "all")},
            "not_priced": [
                {"row": r.row, "split": r.split, "note": self.priced[r.row].note if r.row in self.priced else ""}
                for r in self.runs
                if self.error(r) is None
            ],
            "timing": self.timing,
        }


def validate(
    runs: Sequence[Run],
    settings: Settings,
    jobs: int = 1,
    backend: str = "local",
    address: str | None = None,
    log: Log = lambda msg: None,
) -> tuple[dict[int, Priced], dict[str, Any]]:
    """Price every run (see the module docstring); the predictions by row and the timing."""
    from phaze.pipeline import load_accelerator
    from phaze.search.backend import make_backend

    if settings.accelerator is None:  # a bad hardware file is said before any work
        settings = replace(settings, accelerator=load_accelerator(settings.options.hw))
    if settings.options.kernels not in KERNELS:
        raise PhazeError(f"--kernels {settings.options.kernels}: expected one of {', '.join(KERNELS)}")
    start = time.perf_counter()
    # Identical runs (all but their row, measured time and split equal) are priced once, by the
    # first of them; every run with its own kernels: a run that names the flag's runtime and one
    # that names none are one run (and one compilation).
    first: dict[tuple, Run] = {}
    placed = [r for r in runs if not r.refused]
    keys = {r.row: pricing_key(r, settings) for r in placed}
    for r in placed:
        first.setdefault(keys[r.row], r)
    job_list = jobs_of([replace(r, kernels=settings.kernels_of(r)) for r in first.values()])
    compiles = sum(len(j.compilations) for j in job_list)
    refused = len(runs) - len(placed)
    log(
        f"{count(len(runs), 'run')}"
        + (f" ({count(len(first), 'distinct run')})" if len(first) < len(placed) else "")
        + (f", {refused} refused" if refused else "")
        + f": {count(len({j.shape for j in job_list}), 'shape')}, "
        f"{count(len(job_list), 'trace')} (shape, micro-batch), {count(compiles, 'compilation')} "
        f"(shape, micro-batch, TP, kernels) on {settings.options.hw}"
    )
    results = []
    if backend == "local" and jobs > 1 and len(job_list) > 1:
        # Each spawned worker would import torch, transformers' GPT-2 and the passes itself (6 s
        # of CPU each on the 2-core machine): they fork from one server that imported them once.
        from phaze.search.backend import start_fork_server

        start_fork_server(WORKER_MODULES)
    if job_list:
        with make_backend(backend, jobs, address) as be:
            bundles = bundles_of(job_list, be.jobs)
            results = be.map(price_bundle, [(settings, b) for b in bundles])
    by_first: dict[int, Priced] = {}
    timing: dict[str, Any] = {
        "traces": len(job_list),
        "compilations": compiles,
        "placements": len(placed),  # runs placed: their distinct_runs once each
        "distinct_runs": len(first),
        "refused": refused,
        "jobs": jobs,
    }
    totals = {"trace_s": 0.0, "compile_s": 0.0, "place_s": 0.0}
    for bundle in results:
        for res in bundle:
            for p in res.priced:
                by_first[p.row] = p
            totals["trace_s"] += res.trace_s
            totals["compile_s"] += res.compile_s
            totals["place_s"] += res.place_s
    priced: dict[int, Priced] = {}
    for r in runs:
        if r.refused:
            priced[r.row] = Priced(r.row, None, False, f"refused: {r.refused}")
        elif (p := by_first.get(first[keys[r.row]].row)) is not None:
            priced[r.row] = p if p.row == r.row else Priced(**{**vars(p), "row": r.row})
    timing.update(totals)  # CPU seconds summed over the workers
    timing["wall_s"] = time.perf_counter() - start
    return priced, timing


#: The fields of a run that do not change its price: where it is, what was measured, its part.
#: The recompute and the kernels are resolved against the settings (:func:`pricing_key`).
_UNPRICED_FIELDS = {"row", "line", "measured_ms", "split", "refused", "recompute", "kernels"}
_PRICED_FIELDS = tuple(f.name for f in fields(Run) if f.name not in _UNPRICED_FIELDS)


def pricing_key(r: Run, settings: Settings) -> tuple:
    """What prices ``r`` under ``settings``: runs with equal keys have one price.  Every field of
    :class:`Run` is in it but those of ``_UNPRICED_FIELDS`` (a field added later is then in
    it: runs it tells apart are priced apart), and the recompute and kernels as priced."""
    return (
        *(getattr(r, f) for f in _PRICED_FIELDS),
        r.recompute or settings.options.recompute,
        settings.kernels_of(r),
    )


# ------------------------------------------------------------------------------------------
# Text output
# ------------------------------------------------------------------------------------------


def count(n: int, noun: str) -> str:
    """``1 run``, ``2 runs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _pct(e: float | None) -> str:
    return "-" if e is None else f"{e * 100:+.1f}%"


def _abs_pct(e: float | None) -> str:
    return "-" if e is None else f"{e * 100:.1f}%"


RUN_HEADER = (
    f"{'row':>5} {'split':<7} {'model':<28} {'GPUs':>5} {'batch':>6} {'b':>3} {'PP':>3} {'DP':>4} {'TP':>3} "
    f"{'predicted_s':>12} {'measured_s':>11} {'error':>8}"
)


def run_line(v: Validation, r: Run) -> str:
    p = v.priced.get(r.row)
    pred = f"{p.predicted_s:12.4f}" if p and p.predicted_s is not None else f"{'-':>12}"
    return (
        f"{r.row:>5} {r.split:<7} {r.shape.name:<28} {r.gpus:>5} {r.global_batch:>6} {r.micro_batch:>3} "
        f"{r.pp:>3} {r.dp:>4} {r.tp:>3} {pred} {r.measured_s:>11.4f} {_pct(v.error(r)):>8}"
    )


def report_text(v: Validation, worst: int = 5, per_run: bool = True) -> str:
    """What ``phaze-validate`` prints: every run, then the runs without a prediction (with the
    binding constraint), then per split the summary and its worst runs."""
    lines: list[str] = []
    if per_run:
        lines += [RUN_HEADER] + [run_line(v, r) for r in v.runs] + [""]
    missing = [r for r in v.runs if v.error(r) is None]
    if missing:
        lines.append(f"not priced ({len(missing)}; not in the figures below):")
        for r in missing:
            p = v.priced.get(r.row)
            note = p.note if p else "-"
            lines.append(f"{r.row:>5} {r.split:<7} {r.shape.name} {r.placement} b={r.micro_batch}: {note}")
        lines.append("")
    by_row = {r.row: r for r in v.runs}
    lines.append(f"{'split':<8} {'runs':>5} {'priced':>6} {'median |e|':>10} {'p90 |e|':>8} {'mean e':>8}")
    summaries = {s: v.summary(s, worst) for s in ("dev", "holdout", "all")}
    for s, m in summaries.items():
        lines.append(
            f"{s:<8} {m['runs']:>5} {m['priced']:>6} {_abs_pct(m['median_abs_error']):>10} "
            f"{_abs_pct(m['p90_abs_error']):>8} {_pct(m['mean_error']):>8}"
        )
    for s in ("dev", "holdout"):
        if summaries[s]["worst"]:
            lines += ["", f"worst {s} runs:", RUN_HEADER] + [run_line(v, by_row[row]) for row in summaries[s]["worst"]]
    return "\n".join(lines) + "\n"
