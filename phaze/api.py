"""phaze as a library, for notebooks and scripts: compile a model for a chip and placement
options, get back a :class:`Plan`.

    import phaze

    plan = phaze.compile("examples/llama2_7b.py", hw="h100", devices=64, global_batch=512)
    print(plan)                       # the summary, as phazec prints it
    plan.mfu, plan.tokens_per_s       # the summary's figures
    plan.summary["breakdown_s"]       # the time per batch by part
    plan.module                       # the compiled IR (an xDSL ModuleOp, parsed on first use)
    plan.to_json()                    # what phazec --json writes
    plan.export("megatron")           # what phazec --export megatron FILE writes

``model`` is a model file (``get_model()``, ``get_inputs()``: docs/usage.md, "A model file"), a Hugging
Face ``config.json``, or a factory: a function returning an ``nn.Module`` (build it on the meta
device), with ``inputs(micro_batch, seq_len)`` returning its keyword inputs and ``seq_len``.
The options are :class:`phaze.options.Options`' fields (``devices``, ``global_batch``,
``recompute``, ``zero``, ``dtype``, ``kernels``, ``memory_headroom``...), plus ``micro_batch``
and ``tp`` to fix one micro-batch size and TP width as phazec's flags do.  It is
``phazec MODEL --hw CHIP`` without the files: the same checks, the same sweep, the same plan.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from phaze.options import Options
from phaze_ir.errors import PhazeError

#: phazec's defaults where they differ from :class:`Options`' (a plan for one chip).
_DEFAULTS: dict[str, Any] = {"emit": "plan"}
_NOT_OPTIONS = {"emit", "schedule_cache", "hw"}


@dataclass(frozen=True)
class Plan:
    """A compiled plan: the printed module, the plan JSON (``phazec --json``'s) and what the
    exports need of the model."""

    #: The plan as MLIR text (``phazec -o``'s, without the summary's comment block).
    text: str
    #: The plan as JSON (``phazec --json``'s; docs/usage.md, "The plan as JSON").
    data: dict[str, Any]
    options: Options
    layer_kinds: tuple[str, ...] = ()
    seq_len: int | None = None
    model_shape: dict[str, Any] = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return bool(self.data["feasible"])

    @property
    def binding(self) -> str:
        """Why it does not fit ("" when it does)."""
        return str(self.data["binding"])

    @property
    def summary(self) -> dict[str, Any] | None:
        """The summary (:mod:`phaze.summary`); None when the plan does not fit."""
        return self.data.get("summary")

    def _figure(self, name: str) -> Any:
        return self.summary[name] if self.summary is not None else None

    @property
    def time_per_batch_s(self) -> float:
        return float(self.data["time_per_batch_s"])

    @property
    def samples_per_s(self) -> float:
        return float(self.data["throughput_samples_per_s"])

    @property
    def tokens_per_s(self) -> float | None:
        return self._figure("tokens_per_s")

    @property
    def mfu(self) -> float | None:
        return self._figure("mfu")

    @property
    def hfu(self) -> float | None:
        return self._figure("hfu")

    @property
    def memory_bytes(self) -> dict[str, int] | None:
        """The fullest stage's memory per device by part."""
        return self._figure("memory_bytes")

    @cached_property
    def module(self):
        """The compiled IR (parsed from :attr:`text` on first use: seconds for a large model)."""
        from phaze_ir.ir import parse_module

        return parse_module(self.text)

    def to_json(self) -> str:
        """The plan JSON as ``phazec --json`` writes it."""
        return json.dumps(self.data, indent=2) + "\n"

    def export(self, target: str) -> str:
        """The launch arguments for ``target`` (``megatron`` or ``torchtitan``), as
        ``phazec --export TARGET FILE`` writes them; a plan the target cannot run is one
        :class:`PhazeError` line."""
        from phaze.export import facts_of, render

        facts = facts_of(self.layer_kinds, self.seq_len, self.options, self.model_shape, self.data)
        return render(target, self.data, facts)

    def __str__(self) -> str:
        if self.summary is None:
            return f"no placement fits: {self.binding}"
        return "\n".join(self.summary["lines"])


def options(hw: str, **given: Any) -> Options:
    """:class:`Options` of a chip and keyword options (one :class:`PhazeError` line naming an
    unknown option)."""
    names = {f.name for f in fields(Options)} - _NOT_OPTIONS
    given = dict(given)
    if "micro_batch" in given:
        given["micro_batches"] = (int(given.pop("micro_batch")),)
    if "tp" in given:
        given["tp_widths"] = (int(given.pop("tp")),)
    unknown = sorted(set(given) - names)
    if unknown:
        known = ", ".join(sorted(names | {"micro_batch", "tp"}))
        raise PhazeError(f"phaze.compile: unknown option {unknown[0]!r} (options: {known})")
    if "memory_headroom" not in given:
        from phaze.driver import default_memory_headroom

        given["memory_headroom"] = default_memory_headroom(hw)
    return dataclasses.replace(Options(), hw=hw, **_DEFAULTS, **given)


def factory_spec(
    get_model: Callable[[], Any], inputs: Callable[..., Any] | None, seq_len: int | None, name: str | None
):
    """The model spec of a factory (``get_model``) and its ``inputs(micro_batch, seq_len)``."""
    from phaze_ir.frontend.loader import ModelSpec

    if inputs is None:
        raise PhazeError("phaze.compile: a model factory needs inputs=f(micro_batch, seq_len) returning its inputs")
    label = str(name or getattr(get_model, "__name__", "model"))
    return ModelSpec(
        path=Path(f"<{label}>"),
        name=label,
        get_model=get_model,
        get_inputs=inputs,
        seq_len=seq_len,
        loss_fn=None,
        takes_seq_len=True,
    )


def compile(
    model: str | os.PathLike | Callable[[], Any],
    hw: str = "h100",
    *,
    inputs: Callable[..., Any] | None = None,
    seq_len: int | None = None,
    name: str | None = None,
    cache: str | os.PathLike | None = None,
    log: Callable[[str], None] | None = None,
    **given: Any,
) -> Plan:
    """The plan of ``model`` on ``hw`` (a preset or a hardware TOML) under the options
    ``given`` (module docstring).  ``cache``: a phazec cache directory to answer from and keep
    the answer in (None: none; a factory is never cached: the cache keys a model by its file);
    ``log``: where progress lines go (None: nowhere).  When no placement fits, the plan says so
    (:attr:`Plan.feasible`, :attr:`Plan.binding`)."""
    from phaze import hw_answer

    opts = options(hw, **({"seq_len": seq_len} if seq_len is not None else {}), **given)
    if callable(model):
        source: Any = factory_spec(model, inputs, seq_len, name)
        cache = None
    else:
        source = os.fspath(model)
    answer = hw_answer.answer(source, opts, os.fspath(cache) if cache is not None else None, log or (lambda _: None))
    if answer.plan is None:
        raise PhazeError("phaze.compile: no plan was compiled")
    return Plan(
        text=answer.text,
        data=answer.plan,
        options=opts,
        layer_kinds=tuple(answer.layer_kinds),
        seq_len=answer.seq_len,
        model_shape=dict(answer.model_shape),
    )
