"""Every ``phaze.*`` discardable attribute key, declared once: its name, where it sits, what it
holds and who writes it.

MLIR's convention: what a pass learns about the IR goes in a *discardable* attribute with the
dialect's prefix, which later passes read and other tools may ignore.  Each key has exactly one
meaning and one writer (the importer of ``phazec``, or one pass; a pass that creates an op
gives it the provenance keys of the op it stands for, ``phaze.phase`` and ``phaze.module``); a
pass that finds a key it needs missing says so in the MLIR way, naming the op and the pass to
run first::

    'phaze.matmul' op requires 'phaze.tile'; run phaze-tile-pe-array first

(:func:`require`, :func:`require_records`).  Record attributes (``#phaze.layer_info<...>``)
are named after the key that holds them where the two are one thing, and never reuse another
key's name (docs/design.md §3).
"""

from __future__ import annotations

from typing import TypeVar

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, FloatAttr, IntegerAttr, StringAttr, SymbolRefAttr
from xdsl.ir import Attribute, Operation

from phaze_ir.errors import PhazeError

__all__ = [
    "ALL_KEYS",
    "PROVENANCE",
    "Key",
    "check_module",
    "dict_of",
    "int_of",
    "records_of",
    "require",
    "sample_model_flops",
    "sample_seq_len",
    "require_records",
    "string_of",
]

IMPORTER = "phazec (its importer)"


class Key(str):
    """One discardable attribute key: the key string itself (so ``op.attributes[keys.TILE]``
    works), with where it sits (``op``, ``module``, ``argument`` or ``result``), what it holds
    and who writes it (a pass name, or the importer)."""

    on: str
    holds: str
    writer: str

    def __new__(cls, name: str, on: str, holds: str, writer: str) -> Key:
        key = super().__new__(cls, name)
        key.on, key.holds, key.writer = on, holds, writer
        return key

    def __reduce__(self):
        return (Key, (str(self), self.on, self.holds, self.writer))


# -- written by the importer (phaze_ir/frontend/importer.py) ------------------------------------
MODEL = Key("phaze.model", "module", "string: the model's name", IMPORTER)
MICRO_BATCH_SIZE = Key("phaze.micro_batch_size", "module", "i64: samples per micro-batch traced", IMPORTER)
SEQ_LEN = Key(
    "phaze.seq_len",
    "module",
    "i64: sequence length of a sample as traced (under context parallelism one device's S/c: the whole "
    "sample's is sample_seq_len)",
    IMPORTER,
)
MODEL_SHAPE = Key(
    "phaze.model_shape",
    "module",
    "dictionary: the model's shape as a launcher builds it (hidden_size, num_attention_heads, "
    "num_query_groups, ffn_hidden_size, vocab_size, normalization, position_embedding, ...: "
    "phaze_ir.frontend.shape), from the model object before tracing; only what it could tell",
    IMPORTER,
)
CAPACITY_FACTOR = Key(
    "phaze.capacity_factor",
    "module",
    "f64: the MoE capacity factor the expert GEMMs are padded to (absent: dropless)",
    IMPORTER,
)
PARAMETERS = Key(
    "phaze.parameters", "module", "i64: the model's parameters (elements, each tensor once, unsharded)", IMPORTER
)
MODEL_FLOPS = Key(
    "phaze.model_flops",
    "module",
    "i64: the model FLOPs of one training micro-batch: 3x the forward GEMM FLOPs of the whole, unsharded "
    "step (6·N·tokens plus attention's 12·L·H·Q·T·tokens for a transformer, causal attention's whole square: "
    "PaLM's; the summary's MFU takes off the half a causal kernel skips; an MoE's routed tokens, not its "
    "capacity padding; docs/design.md §6.10); as traced (under context parallelism of S/c tokens: the "
    "whole sample's is sample_model_flops)",
    IMPORTER,
)
ATTENTION_FLOPS = Key(
    "phaze.attention_flops",
    "module",
    "i64: of phaze.model_flops, the fused attentions' score and context GEMMs (3x their forward FLOPs, "
    "unsharded, as traced), which grow with the square of the sequence (absent: none)",
    IMPORTER,
)
CAUSAL_ATTENTION_FLOPS = Key(
    "phaze.causal_attention_flops",
    "module",
    "i64: of phaze.attention_flops, the causal attentions' (their aten op's phaze.fused ends in ' causal'), "
    "whose half above the diagonal the summary's MFU takes off (absent: none)",
    IMPORTER,
)
WINDOW_SKIPPED_FLOPS = Key(
    "phaze.window_skipped_flops",
    "module",
    "i64: of phaze.attention_flops, what the sliding-window attentions' kernels do not compute (all of "
    "their s² square but the causal window's band, op_kinds.causal_fraction), which the summary's MFU "
    "takes off (absent: no window shorter than the sequence)",
    IMPORTER,
)
WARNINGS = Key(
    "phaze.warnings",
    "module",
    "array of #phaze.unpriced_op: opaque ops the cost model does not price (what the plan leaves out)",
    IMPORTER,
)
MODULE = Key("phaze.module", "op", "string: the torch module path the op came from", IMPORTER)
PHASE = Key("phaze.phase", "op", "string: fwd, bwd or opt", IMPORTER)
FUSED = Key(
    "phaze.fused",
    "op",
    "string: the aten op (its traced node) that this op is part of, when aten runs that op as one "
    "kernel (fused attention, dropout); a causal attention's ends in ' causal'",
    IMPORTER,
)
FP8_SCALES = Key(
    "phaze.fp8_scales",
    "op",
    "string: rowwise, on an FP8 GEMM (aten._scaled_mm) whose operands are scaled one scale a row (torchao's "
    "rowwise recipe); absent: one scale a tensor",
    IMPORTER,
)
PARAM = Key("phaze.param", "argument", "string: the parameter's name", IMPORTER)
BUFFER = Key("phaze.buffer", "argument", "string: the buffer's name", IMPORTER)
INPUT = Key("phaze.input", "argument", "string: the input's name", IMPORTER)
GRAD = Key("phaze.grad", "result", "string: the parameter this result is the gradient of", IMPORTER)
LOSS = Key("phaze.loss", "result", "unit: this result is the loss", IMPORTER)
#: The provenance keys: a pass that creates an op gives it those of the op it stands for (the
#: only keys set by more than their writer; tests/test_keys_writers.py holds the rule).
PROVENANCE = (PHASE, MODULE)
#: The key of each role a step function's argument can have.
ARG_ROLES = {"param": PARAM, "buffer": BUFFER, "input": INPUT}

# -- written by the passes (one file each under passes/) ----------------------------------------
UPDATED = Key("phaze.updated", "result", "string: the parameter this result updates", "phaze-insert-optimizer")
SAVED_BYTES = Key("phaze.saved_bytes", "op", "i64: bytes of its results autograd saves", "phaze-mark-saved")
LAYER = Key("phaze.layer", "op", "i64: index of the op's layer", "phaze-group-layers")
LAYERS = Key("phaze.layers", "module", "array of #phaze.layer_info, one per layer", "phaze-group-layers")
TP_WIDTH = Key("phaze.tp_width", "module", "i64: tensor-parallel width sharded for", "phaze-shard-tensor-parallel")
TP_REPLICATED = Key(
    "phaze.tp_replicated",
    "module",
    "array of #phaze.replicated_linears: the linears tensor parallelism keeps replicated (the plan's "
    "warnings say them beside phaze.warnings')",
    "phaze-shard-tensor-parallel",
)
SEQUENCE_PARALLEL = Key(
    "phaze.sequence_parallel",
    "module",
    "unit: sharded with Megatron sequence parallelism (reduce-scatter / all-gather around the GEMMs)",
    "phaze-shard-tensor-parallel",
)
TARGET = Key("phaze.target", "module", "symbol: the phaze.accelerator targeted", "phazec --hw NAME|FILE")
KERNELS = Key(
    "phaze.kernels", "module", "string: the runtime whose kernels the ops are grouped into", "phaze-form-kernels"
)
SDPA_ORDER = Key(
    "phaze.sdpa_order",
    "module",
    "string: torch's SDPA backend order the step runs under when it is not cuDNN first (flash-first: "
    "FlashAttention-2, the kernel traced)",
    "phaze-form-kernels",
)
KERNEL = Key("phaze.kernel", "op", "#phaze.kernel: the kernel the op runs in", "phaze-form-kernels")
COLUMN_KERNEL = Key(
    "phaze.column_kernel",
    "op",
    "unit: the op's kernel takes a max across a tensor's rows (along a dimension not its last: torchao's "
    "column-wise float8 scales), reading across the slow dimension",
    "phaze-form-kernels",
)
TILE = Key("phaze.tile", "op", "#phaze.tile: a GEMM's tiling onto the PE arrays", "phaze-tile-pe-array")
LATENCY = Key("phaze.latency", "op", "#phaze.latency: seconds on one core and split", "phaze-estimate-latency")
CP_RING = Key(
    "phaze.cp_ring",
    "module",
    "dictionary: the context-parallel ring of one micro-batch on one device, summed over its attentions "
    "(fwd_step_s, fwd_hop_s, fwd_ring_s, bwd_step_s, bwd_hop_s, bwd_ring_s: a step's attention, the mean of the "
    "ring's c (the traced diagonal and the unmasked off-diagonal ones), a hop's transfer, the ring's transfers over "
    "its c-1 hops, the ring's whole time; kv_bytes: what one forward hop of the first attention carries)",
    "phaze-estimate-latency",
)
TP_OVERLAP = Key(
    "phaze.tp_overlap",
    "module",
    "unit: the TP all-gathers and reduce-scatters run overlapped with their GEMMs (Transformer Engine's "
    "userbuffers), as phaze-estimate-latency prices them",
    "phaze-overlap-tensor-parallel",
)
CONTEXT_PARALLEL = Key(
    "phaze.context_parallel",
    "module",
    "i64: the context-parallel degree c the step runs at (traced at S/c tokens per sample, its "
    "attention a ring of c steps, as phaze-estimate-latency prices it)",
    "phaze-context-parallel",
)
LAYER_LATENCY = Key(
    "phaze.layer_latency", "module", "array of #phaze.layer_latency: serial sums per layer", "phaze-estimate-latency"
)
LAYER_FLOPS = Key(
    "phaze.layer_flops",
    "module",
    "array of #phaze.layer_flops: the FLOPs one device runs per layer as its ops run (causal kernels' skipped "
    "share off, a context-parallel ring's c steps in: what HFU counts)",
    "phaze-estimate-latency",
)
ENERGY = Key(
    "phaze.energy", "op", "#phaze.energy: joules of one execution on one device, by part", "phaze-estimate-energy"
)
LAYER_ENERGY = Key(
    "phaze.layer_energy",
    "module",
    "array of #phaze.layer_energy: joules per layer and phase, and of its recomputation",
    "phaze-estimate-energy",
)
SCHED = Key("phaze.sched", "op", "#phaze.sched: start, end and cores in its layer's schedule", "phaze-schedule-ops")
LAYER_SCHEDULE = Key(
    "phaze.layer_schedule", "module", "array of #phaze.layer_schedule: makespans per layer", "phaze-schedule-ops"
)
RECOMPUTE = Key(
    "phaze.recompute",
    "op",
    "#phaze<recompute_policy selective>: re-run in backward under selective recompute",
    "phaze-insert-recompute",
)
LAYER_RECOMPUTE = Key(
    "phaze.layer_recompute",
    "module",
    "array of #phaze.layer_recompute: bytes and time per policy",
    "phaze-insert-recompute",
)
LAYER_MEMORY = Key(
    "phaze.layer_memory", "module", "array of #phaze.layer_memory: weights, state, workspace", "phaze-insert-recompute"
)
PLAN = Key(
    "phaze.plan",
    "module",
    "#phaze.plan: the placement and its time per batch (the placement's: what the chip's power limit adds is "
    "phaze.power's power_limit_s)",
    "phaze-place-devices",
)
STAGES = Key("phaze.stages", "module", "array of #phaze.stage_info, one per pipeline stage", "phaze-place-devices")
POWER = Key(
    "phaze.power",
    "module",
    "#phaze.power: the step's energy and the chip's power, and what the power limit adds to the step",
    "phaze-estimate-power",
)
STAGE = Key("phaze.stage", "op", "i64: index of the op's pipeline stage", "phaze-place-devices")

# -- written by the architecture search (phaze/search) ------------------------------------------
BASELINES = Key("phaze.baselines", "module", "array of #phaze.baseline: the search's baselines", "phazec (search)")
MODELS = Key("phaze.models", "module", "array of strings: the models of a several-model plan", "phazec (search)")

#: Every key, in the order above (docs/design.md §3 lists them).
ALL_KEYS: tuple[Key, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Key))


AttributeT = TypeVar("AttributeT", bound=Attribute)


def put(op: Operation, key: Key, value: Attribute | None) -> None:
    """``op``'s ``key`` set to ``value`` (taken off when ``None``).  A key the op has keeps its
    place among the op's attributes: a pass run again on its own output writes the same bytes
    (taking the key off and adding it again would move it after the keys later passes wrote)."""
    if value is None:
        op.attributes.pop(key, None)
    else:
        op.attributes[key] = value


def _missing(op: Operation, key: Key) -> PhazeError:
    run = f"run {key.writer} first" if key.writer.startswith("phaze-") else f"it is written by {key.writer}"
    return PhazeError(f"'{op.name}' op requires '{key}'; {run}")


def require(op: Operation, key: Key, kind: type[AttributeT]) -> AttributeT:
    """``op``'s attribute ``key``, which must be a ``kind``; else the MLIR-style diagnostic
    naming the pass that writes it."""
    attr = op.attributes.get(key)
    if not isinstance(attr, kind):
        raise _missing(op, key)
    return attr


def require_records(op: Operation, key: Key, kind: type[AttributeT]) -> list[AttributeT]:
    """The records of an array-valued key (every element a ``kind``)."""
    attr = op.attributes.get(key)
    records = [r for r in attr.data if isinstance(r, kind)] if isinstance(attr, ArrayAttr) else []
    if not isinstance(attr, ArrayAttr) or len(records) != len(attr.data):
        raise _missing(op, key)
    return records


def string_of(op: Operation, key: Key, default: str = "") -> str:
    """The string ``op`` holds under ``key`` (``default`` when absent or not a string)."""
    attr = op.attributes.get(key)
    return attr.data if isinstance(attr, StringAttr) else default


def int_of(op: Operation, key: Key, default: int) -> int:
    """The positive integer ``op`` holds under ``key`` (a count: a width, a size); ``default``
    when absent, and a :class:`PhazeError` when it holds anything else (``"one"``, ``0``)."""
    attr = op.attributes.get(key)
    if attr is None:
        return default
    if not isinstance(attr, IntegerAttr) or isinstance(attr.value.data, bool) or attr.value.data < 1:
        raise PhazeError(f"'{op.name}' op {key} = {attr}: expected a positive integer")
    return attr.value.data


def dict_of(op: Operation, key: Key) -> dict[str, int | float | str | bool]:
    """The dictionary of scalars ``op`` holds under ``key`` (``{}`` when absent): an ``i1`` as a
    bool, an integer, a float, a string; a :class:`PhazeError` for anything else."""
    attr = op.attributes.get(key)
    if attr is None:
        return {}
    if not isinstance(attr, DictionaryAttr):
        raise PhazeError(f"'{op.name}' op {key} = {attr}: expected a dictionary")
    out: dict[str, int | float | str | bool] = {}
    for name, value in attr.data.items():
        if isinstance(value, IntegerAttr):
            width = getattr(value.type, "width", None)
            out[name] = bool(value.value.data) if width is not None and width.data == 1 else value.value.data
        elif isinstance(value, FloatAttr):
            out[name] = value.value.data
        elif isinstance(value, StringAttr):
            out[name] = value.data
        else:
            raise PhazeError(f"'{op.name}' op {key}: {name} = {value}: expected an integer, a float or a string")
    return out


def check_module(module: Operation) -> None:
    """A :class:`PhazeError` when a module key holds what it is not declared to (its
    ``holds``): an ``i64`` key something else than a positive integer (an f64, ``"one"``), an
    ``f64`` key no float, a ``string`` key no string, ``phaze.target`` no op of the module; or
    when the plan's numbers contradict each other or the ops (:func:`phaze_ir.plan_check.check_plan`)."""
    _check_key_types(module)
    from phaze_ir.plan_check import check_plan  # (it reads the keys declared here)

    check_plan(module)


def _check_key_types(module: Operation) -> None:
    for key in ALL_KEYS:
        attr = module.attributes.get(key)
        if key.on != "module" or attr is None:
            continue
        kind = key.holds.split(":")[0]
        if kind == "i64":
            int_of(module, key, 1)
        elif (kind == "f64" and not isinstance(attr, FloatAttr)) or (
            kind == "string" and not isinstance(attr, StringAttr)
        ):
            raise PhazeError(
                f"'{module.name}' op {key} = {attr}: expected {'a float' if kind == 'f64' else 'a string'}"
            )
        elif kind == "dictionary":
            dict_of(module, key)
        elif kind == "symbol":
            ops = module.regions[0].ops if module.regions else ()
            names = [op.properties.get("sym_name") or op.attributes.get("sym_name") for op in ops]
            if (
                not isinstance(attr, SymbolRefAttr)
                or attr.nested_references.data
                or StringAttr(attr.root_reference.data) not in names
            ):
                raise PhazeError(f"'{module.name}' op {key} = {attr}: expected the symbol of an op of the module")


def sample_seq_len(module: Operation) -> int:
    """The sequence length of a whole sample (0: a model without one): ``phaze.seq_len`` as
    traced, times the context-parallel degree c (``phaze.context_parallel``) whose devices each
    trace S/c of it."""
    return int_of(module, SEQ_LEN, 0) * int_of(module, CONTEXT_PARALLEL, 1)


def sample_model_flops(module: Operation) -> int:
    """The model FLOPs of one micro-batch of whole samples (0: not counted): ``phaze.model_flops``
    as traced, and under context parallelism of degree c (a trace of S/c tokens) c times its
    GEMMs but c² times its attention's (``phaze.attention_flops``: score and context GEMMs
    grow with the square of the sequence); 0 beyond an i64, as the importer leaves it."""
    flops = int_of(module, MODEL_FLOPS, 0)
    c = int_of(module, CONTEXT_PARALLEL, 1)
    if c == 1 or not flops:
        return flops
    attention = int_of(module, ATTENTION_FLOPS, 0)
    whole = c * (flops - attention) + c * c * attention
    return whole if whole < 2**63 else 0


def records_of(op: Operation, key: Key, kind: type[AttributeT]) -> list[AttributeT]:
    """The ``kind`` records of an array-valued key (none when absent)."""
    attr = op.attributes.get(key)
    return [r for r in attr.data if isinstance(r, kind)] if isinstance(attr, ArrayAttr) else []
