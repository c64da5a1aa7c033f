"""phaze as a library, for notebooks and scripts: compile a model for a chip and placement
options, get back a :class:`Plan`.

    import phaze

    plan = phaze.compile("examples/llama2_7b.py", hw="h100", devices=64, global_batch=512)
    print(plan)                       # the summary, as phazec prints it
    plan.mfu, plan.tokens_per_s       # the summary's figures (MFU: causal attention as computed)
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
``phazec MODEL --hw CHIP`` without the files: the same checks, the same sweep, the same plan,
and the same defaults (on a GPU the runtime a practitioner runs: eager kernels, bf16 autocast,
``auto`` ZeRO, sequence parallelism and schedule, DP overlap, torchtitan's selective
checkpointing: ``phaze.driver.runtime_defaults``).

Every argument is checked where it is given, before any work, in one line naming it as the
caller wrote it (``phaze.compile: memory_headroom='0.1': expected a number``): a value of the
wrong type is an :class:`OptionTypeError` (a :class:`PhazeError` and a ``TypeError``), one out
of range a :class:`PhazeError`.  An option whose values are words takes a whole number as its
word (``context_parallel=2`` is ``"2"``, ``zero=1`` is ``"1"``) and an on/off one a bool
(``sequence_parallel=True``); a typed option's word is then parsed as a command line's is
(``context_parallel`` holds 2, ``zero`` ``Zero.OPTIMIZER``: ``passes/algorithms/option_values.py``).
The warnings of a compilation are said once each through
:mod:`warnings`, from the caller's line (never from phaze's), and kept in :attr:`Plan.warnings`.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
import types
import warnings
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from functools import cached_property
from pathlib import Path
from typing import Any

from passes.algorithms.option_values import Dtype, Fp8RecipeSetting
from passes.algorithms.placement_options import OptionError, declared_choices, field_type, parsed_option
from phaze.options import Options
from phaze_ir.errors import PhazeError, PhazeWarning
from phaze_ir.files import excerpt, printable

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
    #: The warnings said while it was compiled, each once (also through :mod:`warnings`).
    warnings: tuple[str, ...] = ()
    #: The export-runtime warnings :meth:`export` has said (each once a plan).
    _exports_said: set[str] = field(default_factory=set, compare=False, repr=False)

    @property
    def feasible(self) -> bool:
        return bool(self.data["feasible"])

    @property
    def binding(self) -> str:
        """Why it does not fit ("" when it does)."""
        return str(self.data["binding"])

    @property
    def summary(self) -> dict[str, Any] | None:
        """The summary (:mod:`phaze.plan.summary`); None when the plan does not fit."""
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
        """The summary's MFU (its ``mfu_causal``): model FLOPs with causal attention counted as
        its kernels compute it, half its square (Megatron-LM's), over the chips' tensor peak; at
        most :attr:`hfu`.  None when the plan does not fit or the step has no model FLOPs."""
        return self._figure("mfu_causal")

    @property
    def mfu_palm(self) -> float | None:
        """MFU in PaLM's convention (the summary's ``mfu_palm``): a causal attention's whole
        s² square counted, so above :attr:`mfu` for a causal model, and at long sequences above
        :attr:`hfu`."""
        return self._figure("mfu_palm")

    @property
    def hfu(self) -> float | None:
        """The FLOPs the devices run (recompute, vector work and the optimizer included) over the
        chips' tensor peak (the summary's ``hfu``)."""
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
        :class:`PhazeError` line.  Where the launch runs another runtime than the one priced
        (kernels, precision, attention, the model: ``phaze.plan.export.runtime_differences``, the
        lines phazec says), each line is a :class:`PhazeWarning`, said once a plan and with no
        source line (:func:`phaze_ir.warning.warn_unsourced`)."""
        from phaze.plan.export import TARGETS, facts_of, render, runtime_differences
        from phaze_ir.warning import warn_unsourced

        if target not in TARGETS:
            kind = PhazeError if isinstance(target, str) else OptionTypeError
            raise kind(f"Plan.export: target={_shown(target)}: expected one of {', '.join(TARGETS)}")
        facts = facts_of(self.layer_kinds, self.seq_len, self.options, self.model_shape, self.data)
        text = render(target, self.data, facts)
        for line in runtime_differences(target, self.data, facts):
            if line not in self._exports_said:
                self._exports_said.add(line)
                warn_unsourced(line)
        return text

    def torchtitan_flavour(self, module: str = "phaze_flavour") -> str | None:
        """The flavour-registration file that ``export("torchtitan")``'s ``--module=phaze_flavour``
        imports (save it as ``phaze_flavour.py`` where torchtitan runs), as ``phazec --export
        torchtitan FILE`` writes it beside FILE; None when the model is a run torchtitan registered
        (the export names it)."""
        from phaze.plan.export import facts_of, torchtitan_flavour_file, torchtitan_registered

        facts = facts_of(self.layer_kinds, self.seq_len, self.options, self.model_shape, self.data)
        return None if torchtitan_registered(facts) else torchtitan_flavour_file(facts, module)

    def __str__(self) -> str:
        if self.summary is None:
            return f"no placement fits: {self.binding}"
        return "\n".join(self.summary["lines"])


class OptionTypeError(PhazeError, TypeError):
    """An argument of :func:`compile` of the wrong type, in one line naming it."""


#: The API's names of the options it takes one value of, and the fields that hold them.
_ONE_VALUE = {"micro_batch": "micro_batches", "tp": "tp_widths"}

#: What a value of each option type must be, in words.
_EXPECTED = {"int": "an integer", "float": "a number", "bool": "True or False", "str": "a string or an integer"}


def _shown(value: Any) -> str:
    """A value as a message quotes it: its Python literal, cut as the input is."""
    return excerpt(repr(value))


def _parsed(f: Field, value: Any) -> Any:
    """``value`` as option field ``f`` holds it (its ``parse``'s), or as given where that refuses
    it (or is not text): :meth:`Options.check` names what is wrong with it."""
    try:
        return parsed_option(f, value) if isinstance(value, str) else value
    except ValueError:
        return value


def _typed(name: str, value: Any, annotation: str, choices: tuple[str, ...] | None) -> Any:
    """``value`` of the option ``name`` as its field holds it (a whole number as the word of a
    text option, a bool as on/off), or an :class:`OptionTypeError` naming it."""
    kinds = [k.strip() for k in annotation.split("|")]
    if value is None and "None" in kinds:
        return None
    kind = kinds[0]
    if kind.startswith("tuple["):  # micro_batches=(1, 2), tp_widths=[2, 4]
        if isinstance(value, (list, tuple)) and value:
            return tuple(_typed(name, v, kind[len("tuple[") :].split(",")[0], None) for v in value)
        raise OptionTypeError(f"phaze.compile: {name}={_shown(value)}: expected a tuple of integers")
    if kind == "int" and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = int(value)  # numpy's integers are integers
    elif kind == "float" and isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = float(value)
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
    }.get(kind, True)
    if ok:
        return value
    if kind == "str" and isinstance(value, bool) and choices is not None and {"on", "off"} <= set(choices):
        return "on" if value else "off"
    if kind == "str" and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return str(int(value))  # context_parallel=2, zero=1: the word of the degree
    expected = _EXPECTED.get(kind, kind) + (" or None" if "None" in kinds else "")
    raise OptionTypeError(f"phaze.compile: {name}={_shown(value)}: expected {expected}")


def _check_hw(hw: Any) -> str:
    """``hw`` as a preset name or a path (an :class:`OptionTypeError` when it is neither)."""
    if isinstance(hw, os.PathLike):
        hw = os.fspath(hw)
    if isinstance(hw, str) and hw.strip():
        return hw
    from phaze_ir.hardware import preset_names

    raise OptionTypeError(
        f"phaze.compile: hw={_shown(hw)}: expected a preset name ({', '.join(preset_names())}) or the path "
        "of a hardware TOML file"
    )


def options(hw: str, **given: Any) -> Options:
    """:class:`Options` of a chip and keyword options, each checked (its type, then its field's
    check), in one :class:`PhazeError` line naming it as the caller did (an unknown option with
    the options there are)."""
    hw = _check_hw(hw)
    names = {f.name for f in fields(Options)} - _NOT_OPTIONS
    unknown = sorted(set(given) - names - set(_ONE_VALUE))
    if unknown:
        known = ", ".join(sorted(names | set(_ONE_VALUE)))
        raise PhazeError(f"phaze.compile: unknown option {unknown[0]!r} (options: {known})")
    by_name = {f.name: f for f in fields(Options)}
    values: dict[str, Any] = {}
    said_as: dict[str, str] = {}  # field -> the name the caller gave it by
    for name, value in given.items():
        target = _ONE_VALUE.get(name, name)
        if target in values:
            raise PhazeError(f"phaze.compile: {name} and {said_as[target]} both given: give one")
        f = by_name[target]
        choices = declared_choices(f) if f.metadata.get("choices") is not None else None
        # (a typed option is given as its text, or as an int or bool that says it, and parsed)
        annotation = "int" if name in _ONE_VALUE else "str" if f.metadata.get("parse") else field_type(f)
        typed = _typed(name, value, annotation, choices)
        values[target] = (typed,) if name in _ONE_VALUE else typed
        said_as[target] = name
    recipe = _parsed(by_name["fp8_recipe"], values.get("fp8_recipe"))
    if recipe not in (None, Fp8RecipeSetting.AUTO) and _parsed(by_name["dtype"], values.get("dtype")) is not Dtype.FP8:
        raise PhazeError(
            f"phaze.compile: fp8_recipe={values['fp8_recipe']!r}: the FP8 linears' scaling needs dtype='fp8'"
        )
    from phaze.driver import default_memory_headroom, runtime_defaults

    try:  # the chip's file is read here: what is wrong with it is said as hw's
        if "memory_headroom" not in values:
            values["memory_headroom"] = default_memory_headroom(hw)
        # phazec's: the runtime a practitioner runs on a GPU, the paper's settings on its chips
        values = runtime_defaults(hw, kernels=values.get("kernels")) | values
    except PhazeError as e:
        raise PhazeError(printable(f"phaze.compile: hw={_shown(hw)}: {e}")) from None
    opts = dataclasses.replace(Options(), hw=hw, **_DEFAULTS, **values)
    try:
        opts.check()
    except OptionError as e:
        name = said_as.get(e.option, e.option)
        # (the value as typed: a newline or an escape code in it is escaped, one line)
        raise PhazeError(printable(f"phaze.compile: {e.named(name, '=')}")) from None
    return opts


def factory_spec(
    get_model: Callable[[], Any], inputs: Callable[..., Any] | None, seq_len: int | None, name: str | None
):
    """The model spec of a factory (``get_model``) and its ``inputs(micro_batch, seq_len)``."""
    from phaze_ir.frontend.loader import ModelSpec

    if inputs is None:
        raise PhazeError("phaze.compile: a model factory needs inputs=f(micro_batch, seq_len) returning its inputs")
    # Printed in the plan and its messages: a control character in it escaped, as a file's name is.
    label = printable(str(name or getattr(get_model, "__name__", "model")))
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
    from phaze.messages import transformers_through_warnings

    _check_arguments(model, inputs, name, cache, log)
    opts = options(hw, **({"seq_len": seq_len} if seq_len is not None else {}), **given)
    if callable(model):
        source: Any = factory_spec(model, inputs, seq_len, name)
        cache = None
    else:
        source = os.fspath(model)
    caught: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as record, transformers_through_warnings():
            warnings.simplefilter("always")
            caught = record
            answer = hw_answer.answer(
                source, opts, os.fspath(cache) if cache is not None else None, log or (lambda _: None)
            )
    finally:  # said once the catch is over, also when the compilation failed (they may say why)
        said = _say_once(caught)
    if answer.plan is None:
        raise PhazeError("phaze.compile: no plan was compiled")
    return Plan(
        text=answer.text,
        data=answer.plan,
        options=opts,
        layer_kinds=tuple(answer.layer_kinds),
        seq_len=answer.seq_len,
        model_shape=dict(answer.model_shape),
        warnings=said,
    )


def _check_arguments(model: Any, inputs: Any, name: Any, cache: Any, log: Any) -> None:
    """:func:`compile`'s arguments other than the options, each of its type."""
    if not (isinstance(model, (str, os.PathLike)) or callable(model)):
        raise OptionTypeError(
            f"phaze.compile: model={_shown(model)}: expected a model file, a config.json or a function returning an "
            "nn.Module"
        )
    for arg, value, expected in (
        ("inputs", inputs, callable(inputs)),
        ("log", log, callable(log)),
        ("name", name, isinstance(name, str)),
        ("cache", cache, isinstance(cache, (str, os.PathLike))),
    ):
        if value is not None and not expected:
            what = "a function" if arg in ("inputs", "log") else "a string" if arg == "name" else "a directory"
            raise OptionTypeError(f"phaze.compile: {arg}={_shown(value)}: expected {what} or None")


def _say_once(caught: list[warnings.WarningMessage]) -> tuple[str, ...]:
    """Say the warnings ``caught`` while compiling again, outside the catch: phaze's each once,
    from :func:`compile`'s caller's line (not the line of phaze that said it, nor once per line
    or worker that said it); any other (a library's) once per place it came from.  phaze's
    messages, in the order first said."""
    said: list[str] = []
    others: set[tuple[Any, ...]] = set()
    level = _outside_phaze()
    for w in caught:
        if issubclass(w.category, PhazeWarning):
            text = str(w.message)
            if text not in said:
                said.append(text)
                warnings.warn(text, w.category, stacklevel=level)
        else:
            key = (w.category, str(w.message), w.filename, w.lineno)
            if key not in others:
                others.add(key)
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return tuple(said)


def _outside_phaze() -> int:
    """The ``stacklevel`` of the first frame, from its caller up, outside the phaze package
    (``phaze.compile`` is :func:`compile` by way of ``phaze/__init__.py``)."""
    import sys

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level
