"""The typed values of options that are parsed once (``placement_options.option``'s ``parse``):
what a field holds once its text is read, compared against members, never against text.

Each is a :class:`TextEnum`, whose ``str()``, formatting and ``repr()`` are the text a user
writes: a plan, a pass spec, a JSON value or a cache key built from an option reads as it did
when the option was held as text (a degree option holds an ``int`` or :data:`AUTO`)."""

from __future__ import annotations

from enum import StrEnum


class TextEnum(StrEnum):
    """An option's choices as members; ``repr()`` too is the text's (``'on'``)."""

    def __repr__(self) -> str:
        return repr(self.value)


class Auto(TextEnum):
    """``auto``: the placement, or the sweep, chooses. An option of a degree holds an int or
    :data:`AUTO` (``--context-parallel``)."""

    AUTO = "auto"


#: The one :class:`Auto`; test an option with ``is AUTO``.
AUTO = Auto.AUTO


class Tristate(TextEnum):
    """A three-valued option (``--sequence-parallel``, ``--tp-overlap``)."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class Zero(TextEnum):
    """``--zero``: what ZeRO shards over data parallelism (the stage's number), or ``auto``,
    the placement chooses (``placement.ZERO_SETTINGS``, in that order)."""

    AUTO = "auto"
    PLAIN = "0"
    OPTIMIZER = "1"
    GRADIENTS = "2"
    PARAMETERS = "3"

    @property
    def stage(self) -> int | None:
        """The ZeRO stage (0 to 3), None under ``auto``."""
        return None if self is Zero.AUTO else int(self.value)


class Recompute(TextEnum):
    """``--recompute``: every stage's policy (``phaze_ir.op_kinds.RecomputePolicy``), or
    ``auto``, the placement chooses each stage's (``placement.RECOMPUTE_SETTINGS``)."""

    AUTO = "auto"
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class Runtime(TextEnum):
    """``--kernels``: the runtime whose kernels the step is priced as
    (``passes/algorithms/kernels.py``'s ``RUNTIMES``, in that order)."""

    OPS = "ops"
    EAGER = "eager"
    INDUCTOR = "inductor"
    MEGATRON = "megatron"


class SdpaOrder(TextEnum):
    """``--sdpa-order``: the attention backend order the step runs under
    (``passes/algorithms/kernels.py``'s ``SDPA_ORDERS``, the default first)."""

    CUDNN_FIRST = "cudnn-first"
    FLASH_FIRST = "flash-first"


class RankOrder(TextEnum):
    """``--rank-order``: how devices are numbered into groups, TP innermost, or ``auto``, the
    placement chooses (``placement.RANK_ORDER_SETTINGS``, in that order)."""

    AUTO = "auto"
    TP_DP_PP = "tp-dp-pp"
    TP_PP_DP = "tp-pp-dp"


class Dtype(TextEnum):
    """``--dtype``: the training precision (``phaze_ir.frontend.trace.DTYPES``, in that order):
    16- or 32-bit weights and activations, ``torch.autocast``'s mixed precision (``amp-``), bf16
    with FP8 linears, or the model's own."""

    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    FLOAT32 = "float32"
    AMP_BFLOAT16 = "amp-bfloat16"
    AMP_FLOAT16 = "amp-float16"
    FP8 = "fp8"
    MODEL = "model"


class Fp8RecipeSetting(TextEnum):
    """``--fp8-recipe``: how ``--dtype fp8``'s linears scale their casts
    (``phaze_ir.frontend.float8_linear.FP8_RECIPE_CHOICES``, in that order), or ``auto``,
    resolved by the exports asked (``float8_linear.resolve_recipe``)."""

    AUTO = "auto"
    DELAYED = "delayed"
    CURRENT = "current"
    TENSORWISE = "tensorwise"
    ROWWISE = "rowwise"


class Optimizer(TextEnum):
    """``--optimizer``: the training step's optimizer (``phaze_ir.op_kinds.OPTIMIZER_KINDS``, in
    that order): mixed-precision Adam (one fused multi-tensor kernel), momentum-free SGD, Adam
    with its state in bf16, mixed-precision Adam as torch's default ``foreach`` runs it (eight
    multi-tensor kernels)."""

    ADAM = "adam"
    SGD = "sgd"
    ADAM_BF16 = "adam-bf16"
    ADAM_FOREACH = "adam-foreach"


class PipelineSchedule(str):
    """``--pipeline-schedule`` parsed (``placement.pipeline_schedule``): its text (``auto``,
    ``1f1b``, ``interleaved:V``), which it reads as, and the model chunks a device holds
    (:attr:`virtual_stages`: None under ``auto``, the placement chooses; 1 under 1F1B)."""

    virtual_stages: int | None

    def __new__(cls, text: str, virtual_stages: int | None) -> PipelineSchedule:
        made = super().__new__(cls, text)
        made.virtual_stages = virtual_stages
        return made

    def __repr__(self) -> str:
        return repr(str(self))

    def __reduce__(self):  # pickled (a sweep's forked children) as what it was made from
        return (PipelineSchedule, (str(self), self.virtual_stages))
